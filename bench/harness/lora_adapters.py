"""Random PEFT LoRA adapters, written by ``peft`` itself: ``make_adapter`` (tests, benchmarks, demos;
``python -m tools.make_lora_adapter``) and ``bench_adapters`` (a benchmark's, written once under ``.cache/lora/``).

``lora_B`` is drawn too (PEFT initialises it to zero, an adapter that changes nothing), every LoRA weight from
``N(0, scale)``, so the adapter visibly changes greedy output. Writes ``adapter_config.json`` and
``adapter_model.safetensors`` as ``PeftModel.save_pretrained`` does.
"""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_adapter(base: str | Path, out: str | Path, *, rank: int = 8, alpha: float = 16.0,
                 targets: tuple[str, ...] = ("q_proj", "v_proj"), rslora: bool = False, scale: float = 0.05,
                 seed: int = 0, **config) -> Path:
    """Write the adapter under ``out``; ``config``: further ``LoraConfig`` fields (``rank_pattern``, ...)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets),
                                                  use_rslora=rslora, lora_dropout=0.0, bias="none",
                                                  task_type="CAUSAL_LM", **config))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    out = Path(out)
    peft_model.save_pretrained(str(out))
    return out


def bench_adapters(model: str, count: int, rank: int) -> tuple[tuple[str, str], ...]:
    """``count`` adapters of ``rank`` on every projection of ``model``, as ``lora_adapters`` pairs."""
    pairs = []
    for i in range(count):
        name = f"bench-r{rank}-{i}"
        folder = REPO / ".cache" / "lora" / Path(model).name / name
        if not (folder / "adapter_model.safetensors").is_file():
            make_adapter(model, folder, rank=rank, alpha=2 * rank, targets=TARGETS, scale=0.02, seed=i)
        pairs.append((name, str(folder)))
    return tuple(pairs)
