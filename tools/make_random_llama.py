"""A seeded random-weight Llama in HF format, for speed benchmarks at a size where weights leave the cache.

    .venv/bin/python -m tools.make_random_llama [--out .cache/models/random-82m] [--seed 0] [--shape 82m|300m]

Shapes: ``82m`` (the default; the "82M-class" model: about 82M parameters, 330 MB in fp32) and ``300m``
(1.1 GB in fp32); bench/harness/random_llama.py says what each is. Never committed; written under .cache/.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from bench.harness.random_llama import REPO, SHAPES, make


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / ".cache" / "models" / "random-82m")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="82m")
    args = ap.parse_args(argv)
    if (args.out / "model.safetensors").is_file():
        print(f"{args.out} exists")
        return 0
    make(args.out, seed=args.seed, **SHAPES[args.shape])
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
