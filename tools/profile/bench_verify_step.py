"""What a verify step costs in plain decode steps: the native decode op at T tokens of one sequence, by context.

    python -m tools.profile.bench_verify_step [--model models/demo-target] [--contexts 8,128,400,1000]
                                               [--tokens 1,2,3,5,8] [--batch 8] [--reps 300] [--threads 1]

Times one ``decode_forward`` call (``NativeDecodeStep.forward``, the fast decode step of a checkpoint; median of
``--reps`` calls after a warm-up) for T consecutive tokens of ONE sequence at context C (a verify step of T - 1
drafts), and ``--batch`` sequences of one token each at context C (a batch decode step). Prints the µs per call
and the T-token / 1-token ratio per context: speculation with k drafts pays when the expected accepted length
exceeds the ratio at T = k + 1. The cells are measured round-robin so load drift hits all of them alike; only the
ratios within one run mean anything on a shared machine (check ``uptime`` first, docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import statistics
import timeit
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
from backend.config import EngineConfig
from backend.engine.builder import build_engine_parts


def step_inputs(block_size: int, rows: int, tokens: int, ctx: int):
    """Token ids, positions, rows and block tables of ``rows`` sequences of ``tokens`` new tokens at ``ctx``."""
    per_row = -(-(ctx + tokens) // block_size)
    tables = torch.arange(rows * per_row, dtype=torch.int32).reshape(rows, per_row)
    ids = torch.randint(3, 4000, (rows * tokens,), dtype=torch.int64)
    pos = torch.arange(ctx, ctx + tokens, dtype=torch.int64).repeat(rows)
    row_ids = torch.arange(rows, dtype=torch.int32).repeat_interleave(tokens)
    return ids, pos, row_ids, tables


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "models/demo-target"))
    ap.add_argument("--contexts", default="8,128,400,1000")
    ap.add_argument("--tokens", default="1,2,3,5,8")
    ap.add_argument("--batch", type=int, default=8, help="sequences of the batch decode column (0: none)")
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    tokens = [int(t) for t in args.tokens.split(",")]
    if 1 not in tokens:
        raise ValueError("--tokens must include 1 (the ratios' baseline)")
    torch.manual_seed(0)
    need = max(contexts) + max(tokens)
    parts = build_engine_parts(EngineConfig.from_settings(model_path=args.model, device="cpu",
                                                          cpu_threads=args.threads, fast_decode=True,
                                                          kv_cache_bytes=256 << 20, max_model_len=need + 16))
    step = parts.runner.fast_decode
    if step is None:
        raise SystemExit("the fast decode step cannot serve this model (or the native build failed)")
    blocks = step.k_cache[0].shape[0]
    cells = {}
    for ctx in contexts:
        for t in tokens:
            cells[(ctx, "T", t)] = step_inputs(step.block_size, 1, t, ctx)
        if args.batch:
            cells[(ctx, "B", args.batch)] = step_inputs(step.block_size, args.batch, 1, ctx)
    for key, inputs in cells.items():
        if int(inputs[3].max()) >= blocks:
            raise SystemExit(f"{key}: needs {int(inputs[3].max()) + 1} KV blocks, the cache has {blocks}")
        for _ in range(10):
            step.forward(*inputs)
    times: dict = {key: [] for key in cells}
    rounds = 3
    for _ in range(rounds):
        for key, inputs in cells.items():
            times[key].append(statistics.median(timeit.repeat(lambda inputs=inputs: step.forward(*inputs), number=1,
                                                         repeat=max(1, args.reps // rounds))) * 1e6)
    us = {key: statistics.median(v) for key, v in times.items()}
    print(f"model {args.model}, {args.threads} thread(s); µs per decode_forward call (median), "
          f"and the ratio to the 1-token step at the same context")
    for ctx in contexts:
        base = us[(ctx, "T", 1)]
        line = "  ".join(f"T={t}: {us[(ctx, 'T', t)]:6.0f} ({us[(ctx, 'T', t)] / base:4.2f}x)" for t in tokens)
        if args.batch:
            b = us[(ctx, "B", args.batch)]
            line += f"  | B={args.batch}x1: {b:6.0f} ({b / base:4.2f}x)"
        print(f"ctx {ctx:5d}: {line}", flush=True)


if __name__ == "__main__":
    main()
