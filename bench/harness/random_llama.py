"""A seeded random-weight Llama in HF format, for speed benchmarks at a size where weights leave the cache
(``python -m tools.make_random_llama``; bench/bench_formats.py, bench/bench_quant.py).

Shapes: ``82m`` (the default; the "82M-class" model of the decode-speed and quantization issues): vocabulary 4,096
(the demo tokenizer, copied in), hidden 768, intermediate 2,048, 12 layers, 12 heads, 4 KV heads, untied head:
about 82M parameters, 330 MB in fp32; ``300m`` (``SHAPES``; bench/bench_formats.py): 24 layers x 1024,
intermediate 2,816, 16 heads, 4 KV heads: 1.1 GB in fp32. Never committed; written under .cache/.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from backend.model.config import ModelConfig
from backend.model.llama import LlamaForCausalLM
from backend.model.loader import save_model

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "models" / "demo-target"
SHAPES = {"82m": {}, "300m": dict(hidden=1024, intermediate=2816, layers=24, heads=16, kv_heads=4)}


def make(out: Path, *, seed: int = 0, hidden: int = 768, intermediate: int = 2048, layers: int = 12, heads: int = 12,
         kv_heads: int = 4, vocab: int = 4096, max_pos: int = 2048) -> Path:
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab, "hidden_size": hidden,
           "intermediate_size": intermediate, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "max_position_embeddings": max_pos, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float32",
           "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu"}
    torch.manual_seed(seed)
    model = LlamaForCausalLM(ModelConfig.from_dict(cfg))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02) if p.dim() == 2 else p.fill_(1.0)
    save_model(model, out, cfg)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (DEMO / name).is_file():
            shutil.copy(DEMO / name, out / name)
    return out
