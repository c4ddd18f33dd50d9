"""The native paged attention alone (the ``paged_attention`` op: one layer's K/V write and attention of a decode step).

    python -m tools.profile.bench_paged_attention_native [--heads 6 --kv-heads 2 --head-dim 32] [--layers 4]
                                                          [--contexts 128,400,1000,4000] [--threads 1]

Per context: a verify step (T tokens of one sequence) for T in ``--tokens`` and a batch decode step of ``--batch``
sequences, each call on the next of ``--layers`` caches in turn (as the decode step walks its layers, so the
KV the calls read is as large as the model's). Prints µs per call (median) and multiply-adds per second of the
attention (QK^T and PV: 2 x ctx x heads x head_dim per token). Ratios within one run only (docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import math
import statistics
import timeit

import torch

from backend.native.build import native_ops


def layer_cycle(ops, caches, qkv, positions, token_rows, tables, heads):
    """A call of the op on the next layer's caches each time."""
    h, kvh, hd = heads
    layer = 0

    def call():
        nonlocal layer
        k, v = caches[layer]
        layer = (layer + 1) % len(caches)
        ops.paged_attention(qkv, positions, token_rows, tables, k.shape[1], k, v, h, kvh, hd, 1.0 / math.sqrt(hd))
    return call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--contexts", default="128,400,1000,4000")
    ap.add_argument("--tokens", default="1,5")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    build = native_ops()
    if not build.available:
        raise SystemExit(f"native ops unavailable: {build.reason}")
    torch.set_num_threads(args.threads)
    h, kvh, hd, bs = args.heads, args.kv_heads, args.head_dim, args.block_size
    contexts = [int(c) for c in args.contexts.split(",")]
    cells = [(t, 1) for t in map(int, args.tokens.split(","))] + ([(1, args.batch)] if args.batch else [])
    max_tokens = max(t for t, _ in cells)
    per_row = -(-(max(contexts) + max_tokens) // bs)
    rows = max(b for _, b in cells)
    caches = [(torch.randn(rows * per_row, bs, kvh, hd), torch.randn(rows * per_row, bs, kvh, hd))
              for _ in range(args.layers)]
    tables = torch.randperm(rows * per_row, dtype=torch.int32).reshape(rows, per_row).contiguous()
    print(f"heads {h}/{kvh} x {hd}, block {bs}, {args.layers} layers of KV, {args.threads} thread(s): "
          f"µs per call (median), attention GFMA/s")
    for ctx in contexts:
        line = []
        for tokens, batch in cells:
            qkv = torch.randn(tokens * batch, (h + 2 * kvh) * hd)
            positions = torch.arange(ctx, ctx + tokens).repeat(batch)
            token_rows = torch.arange(batch, dtype=torch.int32).repeat_interleave(tokens)
            call = layer_cycle(build.ops, caches, qkv, positions, token_rows, tables, (h, kvh, hd))
            for _ in range(2 * args.layers):
                call()
            us = statistics.median(timeit.repeat(call, number=1, repeat=args.calls)) * 1e6
            fma = 2 * sum(int(p) + 1 for p in positions) * h * hd
            line.append(f"{'T' if batch == 1 else 'B'}={max(tokens, batch)}: {us:7.1f} µs {fma / us / 1e3:5.1f}")
        print(f"ctx {ctx:5d}: " + "   ".join(line), flush=True)


if __name__ == "__main__":
    main()
