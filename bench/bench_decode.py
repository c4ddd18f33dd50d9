"""Decode speed: the fast decode step against the eager one, 1 and 2 threads, in one run.

    python -m bench.bench_decode [--model models/demo-target] [--model .cache/models/random-82m]
                                           [--batches 1,32] [--repeats 3] [--spec none] [--modes eager,fast]
                                           [--lora-rank 16] [--lora-adapters 4]

Per model, batch size, thread count and ``fast_decode`` setting: ``batch`` prompts of 64 tokens, 128 greedy
tokens each (EOS ignored), driven by ``LLMEngine.step()`` on this thread; decode tokens/s counts the steps after
every prompt's prefill (as llama.cpp's ``llama-batched-bench`` reports its generation speed). The
configurations are measured round-robin ``--repeats`` times and the median is kept, so that load drifting on a
shared machine hits all of them alike. Prints fast/eager and 2-thread/1-thread ratios; writes
bench/results/decode.json. Mode ``lora`` is the fast step with ``--lora-adapters`` random adapters of
``--lora-rank`` on every projection (``bench/harness/lora_adapters.py``), the batch's requests spread over them
round-robin (batch 1: one adapter); with ``fast`` measured too it prints lora/fast. Check ``uptime`` first
(docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from bench.harness.lora_adapters import bench_adapters
from bench.harness.report import git_commit, machine, write_json
from contracts.sampling_params import SamplingParams

PROMPT, NEW = 64, 128


def decode_tok_per_s(engine: LLMEngine, batch: int, seed: int, adapters: list[str] | None = None
                     ) -> tuple[float, float]:
    """Tokens/s of the decode steps of one batch (prefill steps excluded), and the process's CPU seconds per
    step over them (all threads; unlike wall time, not inflated while other jobs hold the cores). ``adapters``:
    the requests' LoRA adapters, round-robin."""
    gen = torch.Generator().manual_seed(seed)
    for i in range(batch):
        params = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True,
                                lora_name=adapters[i % len(adapters)] if adapters else None)
        engine.add_request(f"b{seed}-{i}", torch.randint(3, 4000, (PROMPT,), generator=gen).tolist(), params,
                           lambda out: None)
    engine.step()
    while engine.stats().num_prefilling or engine.stats().num_waiting:
        engine.step()
    t0, cpu0, steps0 = time.perf_counter(), time.process_time(), engine.stats().steps
    while engine.has_work():
        engine.step()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    steps = max(1, engine.stats().steps - steps0)
    return batch * (NEW - 1) / seconds, cpu / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", action="append", help="checkpoint folder (repeatable)")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--spec", default="none", help="speculative_method of every engine (none | ngram)")
    ap.add_argument("--modes", default="eager,fast", help="settings measured: a subset of eager, fast, lora")
    ap.add_argument("--lora-rank", type=int, default=16, help="rank of the adapters of mode lora")
    ap.add_argument("--lora-adapters", type=int, default=4, help="adapters of mode lora")
    args = ap.parse_args()
    models = args.model or ["models/demo-target"]
    batches = [int(b) for b in args.batches.split(",")]
    thread_counts = [int(t) for t in args.threads.split(",")]
    modes = ("eager", "fast", "lora")
    if not args.modes or any(m not in modes for m in args.modes.split(",")):
        ap.error(f"--modes: a comma-separated subset of {', '.join(modes)}")
    fast_settings = [m for m in modes if m in args.modes.split(",")]
    load_before = os.getloadavg()
    engines = {}
    for model in models:
        for threads in thread_counts:
            for mode in fast_settings:
                lora = bench_adapters(model, args.lora_adapters, args.lora_rank) if mode == "lora" else None
                cfg = EngineConfig.from_settings(model_path=model, fast_decode=mode != "eager", cpu_threads=threads,
                                                 max_num_seqs=64,
                                                 num_kv_blocks=(max(batches) * (PROMPT + NEW)) // 16 + 64,
                                                 max_model_len=512, speculative_method=args.spec, lora_adapters=lora,
                                                 max_loras=max(args.lora_adapters, 1),
                                                 max_lora_rank=max(args.lora_rank, 1))
                engines[(model, threads, mode)] = LLMEngine(cfg)
    samples: dict[tuple, list[float]] = {}
    for rep in range(args.repeats):
        for batch in batches:
            for key, engine in engines.items():
                # torch's thread count is process-wide and each engine set it at build: give each its own
                torch.set_num_threads(key[1])
                engine.threads._current = key[1]   # what the engine's ThreadPolicy believes is set
                adapters = engine.lora.names if engine.lora is not None else None
                samples.setdefault(key + (batch,), []).append(decode_tok_per_s(engine, batch, seed=rep,
                                                                               adapters=adapters))
    med = {k: statistics.median(tps for tps, _ in v) for k, v in samples.items()}
    cpu_ms = {k: 1e3 * statistics.median(c for _, c in v) for k, v in samples.items()}
    rows = []
    names = {m: m for m in modes}
    print(f"{'model':<28} {'batch':>5} {'thr':>3} " + " ".join(f"{names[f] + ' tok/s':>11}" for f in fast_settings)
          + (f" {'fast/eager':>10}" if {"eager", "fast"} <= set(fast_settings) else "")
          + f" {'CPU ms/step ' + ' / '.join(names[f] for f in fast_settings):>25}")
    for model in models:
        for batch in batches:
            for threads in thread_counts:
                row = {"model": model, "batch": batch, "threads": threads}
                for f in fast_settings:
                    key = (model, threads, f, batch)
                    row |= {f"{names[f]}_tok_per_s": med[key], f"cpu_ms_per_step_{names[f]}": cpu_ms[key],
                            f"samples_{names[f]}": samples[key]}
                line = f"{Path(model).name:<28} {batch:>5} {threads:>3} " + " ".join(
                    f"{row[names[f] + '_tok_per_s']:>11.0f}" for f in fast_settings)
                if "eager" in fast_settings and "fast" in fast_settings:
                    row["fast_over_eager"] = row["fast_tok_per_s"] / row["eager_tok_per_s"]
                    line += f" {row['fast_over_eager']:>10.2f}"
                if "lora" in fast_settings and "fast" in fast_settings:
                    row["lora_over_fast"] = row["lora_tok_per_s"] / row["fast_tok_per_s"]
                    line += f"  lora/fast {row['lora_over_fast']:.2f}"
                rows.append(row)
                print(line + f" {' / '.join(format(row['cpu_ms_per_step_' + names[f]], '.2f') for f in fast_settings):>25}",
                      flush=True)
            if len(thread_counts) == 2:
                lo, hi = thread_counts
                for fast in fast_settings:
                    r = med[(model, hi, fast, batch)] / med[(model, lo, fast, batch)]
                    print(f"{'':<28} {batch:>5} {'':>3} {hi} threads / {lo} ({names[fast]}): {r:.2f}")
    write_json(Path(__file__).resolve().parent / "results" / "decode.json",
               {"rows": rows, "repeats": args.repeats, "spec": args.spec, "modes": args.modes,
                "machine": machine(load_before), "commit": git_commit()})


if __name__ == "__main__":
    main()
