"""CPU micro-benchmark of the torch paged attention backend (one layer, per-step prepare).

    python -m tools.profile.bench_paged_attention [--threads 1]

Prints the best-of-N time of ``prepare`` and of one layer's ``forward`` for pure decode
steps (batch 1 and 32) and a mixed step (31 decodes + one 256-token prefill chunk).
"""
from __future__ import annotations

import argparse
import time

import torch

from backend.attention.metadata import build_attention_metadata
from backend.attention.torch_paged import TorchPagedAttention
from backend.core.kv_cache import KVCache


def best_time(fn, iters: int, reps: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


def run(ctx_lens, query_lens, heads, kv_heads, head_dim, dtype, block_size=16):
    tables, at = [], 0
    for c, q in zip(ctx_lens, query_lens):
        n = -(-(c + q) // block_size)
        tables.append(list(range(at, at + n)))
        at += n
    cache = KVCache(1, at, block_size, kv_heads, head_dim, dtype=dtype)
    cache.data.normal_()
    md = build_attention_metadata(ctx_lens, query_lens, tables, block_size)
    t = sum(query_lens)
    q = torch.randn(t, heads, head_dim, dtype=dtype)
    k, v = torch.randn(t, kv_heads, head_dim, dtype=dtype), torch.randn(t, kv_heads, head_dim, dtype=dtype)
    attn = TorchPagedAttention(cache)
    iters = max(3, int(3e6 / (sum(c + q for c, q in zip(ctx_lens, query_lens)) * heads * head_dim)))
    tp = best_time(lambda: attn.prepare(md), iters)
    attn.prepare(md)
    tf = best_time(lambda: attn.forward(0, q, k, v), iters)
    return tp, tf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shapes = [("demo 8/2x32", 8, 2, 32, torch.float32), ("8B 32/8x128", 32, 8, 128, torch.float32),
              ("8B 32/8x128", 32, 8, 128, torch.bfloat16)]
    for name, h, kvh, d, dtype in shapes:
        for label, ctx, ql in [("decode B=1  ctx=512", [512], [1]), ("decode B=32 ctx=512", [512] * 32, [1] * 32),
                               ("decode B=1  ctx=2048", [2048], [1]), ("decode B=32 ctx=2048", [2048] * 32, [1] * 32),
                               ("mixed 31 dec + 256 prefill", [512] * 31 + [0], [1] * 31 + [256])]:
            tp, tf = run(ctx, ql, h, kvh, d, dtype)
            print(f"{name:12s} {str(dtype)[6:]:9s} {label:27s} prepare {tp * 1e6:8.0f} us   "
                  f"forward/layer {tf * 1e6:9.0f} us")


if __name__ == "__main__":
    main()
