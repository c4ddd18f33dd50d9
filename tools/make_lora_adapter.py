"""A random PEFT LoRA adapter for a checkpoint, written by ``peft`` itself (for tests, benchmarks and demos).

    .venv/bin/python -m tools.make_lora_adapter --base models/demo-target --out .cache/lora/a \\
        [--rank 8] [--alpha 16] [--targets q_proj,v_proj] [--rslora] [--scale 0.05] [--seed 0]

``lora_B`` is drawn too (PEFT initialises it to zero, an adapter that changes nothing), every LoRA weight from
``N(0, scale)``, so the adapter visibly changes greedy output. Writes ``adapter_config.json`` and
``adapter_model.safetensors`` as ``PeftModel.save_pretrained`` does.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch


def make_adapter(base: str | Path, out: str | Path, *, rank: int = 8, alpha: float = 16.0,
                 targets: tuple[str, ...] = ("q_proj", "v_proj"), rslora: bool = False, scale: float = 0.05,
                 seed: int = 0, **config) -> Path:
    """Write the adapter under ``out``; ``config``: further ``LoraConfig`` fields (``rank_pattern``, ...)."""
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the base checkpoint's folder (HF format)")
    ap.add_argument("--out", required=True, help="the adapter's folder")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--targets", default="q_proj,v_proj", help="comma-separated projections")
    ap.add_argument("--rslora", action="store_true")
    ap.add_argument("--scale", type=float, default=0.05, help="standard deviation of every LoRA weight")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    out = make_adapter(a.base, a.out, rank=a.rank, alpha=a.alpha, targets=tuple(a.targets.split(",")),
                       rslora=a.rslora, scale=a.scale, seed=a.seed)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
