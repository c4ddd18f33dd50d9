"""The decode step's f32 projections alone: the native GEMV (``decode_gemv``) against ``F.linear`` (MKL), one run.

    python -m tools.profile.bench_gemv [--hidden 768 --intermediate 2048 --layers 12 --heads 12 --kv-heads 4
                                       --vocab 4096] [--tokens 1,2,4,8] [--threads 1,2] [--passes 20] [--json F]

Per token count and thread count, one *pass* runs every projection of a decode step of a Llama of that shape
(per layer QKV, o, gate-up, down; then the LM head; default: the 82M-class model, 330 MB of weights, distinct
tensors so that nothing stays in the cache) through each implementation; the passes alternate between the two
implementations and the median time per pass is kept. A third implementation, ``native_huge``, runs the native
GEMV on a copy of the weights on transparent huge pages (``backend/engine/huge_pages.py``, as the fast decode
step keeps them), when the kernel allows. Prints ms per pass, the weight bandwidth it implies (GB/s) and the
ratios; ``--json`` also writes the rows to a file. Run it on an otherwise idle machine (docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from backend.engine.huge_pages import copy_to_huge_pages
from backend.native import native_ops


def projection_shapes(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int
                      ) -> list[tuple[int, int]]:
    """(out, in) of every projection of one decode step, in order."""
    head_dim = hidden // heads
    layer = [((heads + 2 * kv_heads) * head_dim, hidden), (hidden, heads * head_dim), (2 * intermediate, hidden),
             (hidden, intermediate)]
    return layer * layers + [(vocab, hidden)]


def time_pass(project, operands: list[tuple[torch.Tensor, torch.Tensor]], xs: dict[int, torch.Tensor]) -> float:
    """One pass: ``project(x, w, operand)`` for every weight ``w`` (the operand: ``w`` itself or its panels)."""
    t0 = time.perf_counter()
    for w, operand in operands:
        project(xs[w.shape[1]], w, operand)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    for name, default in (("hidden", 768), ("intermediate", 2048), ("layers", 12), ("heads", 12), ("kv-heads", 4),
                          ("vocab", 4096)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--tokens", default="1,2,4,8")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--native-only", action="store_true",
                    help="time only the native GEMV on 4 KiB pages: one copy of the weights, so a model whose weights "
                         "fit in the last-level cache keeps them there (the three implementations together hold three "
                         "copies)")
    ap.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    args = ap.parse_args()
    build = native_ops()
    if not build.available:
        sys.exit(f"native ops unavailable: {build.reason}")
    ops = build.ops
    load_before = os.getloadavg()
    shapes = projection_shapes(args.hidden, args.intermediate, args.layers, args.heads, args.kv_heads, args.vocab)
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=gen) * 0.02 for n, k in shapes]
    nbytes = sum(w.numel() * 4 for w in weights)
    native = lambda x, w, panels: ops.decode_gemv(x, panels, w.shape[0])
    panels = [ops.pack_panels(w) for w in weights]
    operands = {"native": list(zip(weights, panels))}
    impls = {"native": native}
    if not args.native_only:
        impls["linear"], operands["linear"] = lambda x, w, _: F.linear(x, w), list(zip(weights, weights))
        huge = copy_to_huge_pages(panels)
        if huge is not None:
            impls["native_huge"], operands["native_huge"] = native, list(zip(weights, huge))
    print(f"{len(weights)} projections, {nbytes / 1e6:.0f} MB of fp32 weights per pass; kernel: "
          f"{ops.decode_gemv_isa()} panels; huge pages: {'yes' if 'native_huge' in impls else 'no'}; "
          f"load {load_before[0]:.2f}")
    print(f"{'tokens':>6} {'thr':>3} " + " ".join(f"{n + ' ms':>15}" for n in impls) + " "
          + " ".join(f"{n + ' GB/s':>17}" for n in impls) + (f" {'linear/native time':>18}" if "linear" in impls else "")
          + (f" {'4K/huge time':>12}" if "native_huge" in impls else ""))
    rows, before = [], torch.get_num_threads()
    try:
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            for tokens in (int(t) for t in args.tokens.split(",")):
                xs = {k: torch.randn(tokens, k, generator=gen) for k in {w.shape[1] for w in weights}}
                for w, p in operands["native"][:4]:   # the two agree before anything is timed
                    torch.testing.assert_close(native(xs[w.shape[1]], w, p), F.linear(xs[w.shape[1]], w),
                                               atol=1e-4, rtol=1e-4)
                seconds = {name: [] for name in impls}
                for _ in range(args.passes + 1):          # the first pass of each is a warm-up
                    for name, fn in impls.items():
                        seconds[name].append(time_pass(fn, operands[name], xs))
                med = {name: statistics.median(s[1:]) for name, s in seconds.items()}
                row = {"tokens": tokens, "threads": threads, **{f"{n}_ms": 1e3 * m for n, m in med.items()},
                       **{f"{n}_gb_per_s": nbytes / m / 1e9 for n, m in med.items()},
                       **({"linear_over_native": med["linear"] / med["native"]} if "linear" in med else {})}
                if "native_huge" in med:
                    row["native_over_native_huge"] = med["native"] / med["native_huge"]
                rows.append(row)
                print(f"{tokens:>6} {threads:>3} " + " ".join(f"{row[n + '_ms']:>15.2f}" for n in impls) + " "
                      + " ".join(f"{row[n + '_gb_per_s']:>17.1f}" for n in impls)
                      + (f" {row['linear_over_native']:>18.2f}" if "linear" in med else "")
                      + (f" {row['native_over_native_huge']:>12.2f}" if "native_huge" in med else ""), flush=True)
    finally:
        torch.set_num_threads(before)
    for tokens in sorted({r["tokens"] for r in rows}):
        by = {r["threads"]: r for r in rows if r["tokens"] == tokens}
        if 1 in by and len(by) > 1:
            hi = max(by)
            print(f"tokens {tokens}: native {hi} threads / 1 (speed): {by[1]['native_ms'] / by[hi]['native_ms']:.2f}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "weight_bytes": nbytes, "isa": ops.decode_gemv_isa(),
                                         "load_before": load_before, "args": {k: str(v) for k, v in vars(args).items()}},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
