"""A random PEFT LoRA adapter for a checkpoint, written by ``peft`` itself (for tests, benchmarks and demos).

    .venv/bin/python -m tools.make_lora_adapter --base models/demo-target --out .cache/lora/a \\
        [--rank 8] [--alpha 16] [--targets q_proj,v_proj] [--rslora] [--scale 0.05] [--seed 0]

The adapter: ``bench.harness.lora_adapters.make_adapter`` (every LoRA weight, ``lora_B`` too, from ``N(0, scale)``,
so it visibly changes greedy output).
"""
from __future__ import annotations

import argparse

from bench.harness.lora_adapters import make_adapter


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
