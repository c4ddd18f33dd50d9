"""Checkpoints for tests: the committed demo models, and tiny random Llamas sharing the demo tokenizer."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
DEMO_TARGET = REPO / "models" / "demo-target"
DEMO_DRAFT = REPO / "models" / "demo-draft"
DEMO_LORA = REPO / "models" / "demo-lora" / "torch-style"   # tools/train_lora.py, docs/lora.md
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def make_random_checkpoint(folder: Path, *, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                           intermediate: int = 128, tie: bool = True, seed: int = 0, extra: dict | None = None,
                           max_pos: int = 1024) -> Path:
    """A random-weight Llama in HF format sharing the demo tokenizer (vocab 4096)."""
    from backend.model.config import ModelConfig
    from backend.model.llama import LlamaForCausalLM
    from backend.model.loader import save_model

    tok = json.loads((DEMO_TARGET / "tokenizer.json").read_text())
    vocab = max(list(tok["model"]["vocab"].values()) + [t["id"] for t in tok["added_tokens"]]) + 1
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
        "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "max_position_embeddings": max_pos,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": tie, "torch_dtype": "float32",
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "hidden_act": "silu",
    }
    cfg.update(extra or {})
    torch.manual_seed(seed)
    model = LlamaForCausalLM(ModelConfig.from_dict(cfg))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
            else:
                p.uniform_(0.8, 1.2)
    save_model(model, folder, cfg)
    for f in TOKENIZER_FILES:
        shutil.copy(DEMO_TARGET / f, folder / f)
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}) + "\n")
    return folder


def demo_vocab_size() -> int:
    tok = json.loads((DEMO_TARGET / "tokenizer.json").read_text())
    return max(list(tok["model"]["vocab"].values()) + [t["id"] for t in tok["added_tokens"]]) + 1


def make_hf_checkpoint(folder: Path, config_class: str, *, seed: int = 0,
                       norm_ranges: dict[str, tuple[float, float]] | None = None, **fields) -> Path:
    """A random-weight checkpoint written by transformers itself (``config_class``, e.g. ``"Qwen3Config"``, with
    ``fields``; ``save_pretrained``) sharing the demo tokenizer: matrices drawn N(0, 0.08), norm weights and
    biases near 1 and 0, so greedy outputs vary; ``norm_ranges``: the uniform range of the norm weights whose name
    holds a key instead."""
    import transformers

    cfg = getattr(transformers, config_class)(vocab_size=demo_vocab_size(), bos_token_id=0, eos_token_id=1,
                                              pad_token_id=2, **fields)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
            elif name.endswith(".bias"):
                p.normal_(0, 0.1)
            else:
                p.uniform_(*next((r for k, r in (norm_ranges or {}).items() if k in name), (0.8, 1.2)))
    model.save_pretrained(str(folder))
    for f in TOKENIZER_FILES:
        shutil.copy(DEMO_TARGET / f, folder / f)
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}) + "\n")
    return folder
