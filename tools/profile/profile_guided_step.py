"""Where a guided step's extra time goes: µs per engine step, per call, guided requests against unguided
twins of the same length (bench_guided.py's workload), steps run on this thread (no loop thread).

    python -m tools.profile.profile_guided_step                    # batch 1, fast decode step on
    python -m tools.profile.profile_guided_step --concurrency 32 --fast-decode off

Each phase is a wrapped method (the wrapper adds ~0.3 µs per call); medians and means over the decode steps
of every round. The grammar phases: ``begin_fill`` (before the forward), ``PendingFill.result`` (the wait for,
or the fill of, the bitmask after it), ``fill_rows`` (steps without drafts) / ``fill_bitmask`` (with drafts) /
``fill_bitmasks`` (the fill itself, wherever it runs),
``kernels.*`` (the mask in the sampler), ``accept``, ``poll``.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.sampling.bitmask_kernels import BitmaskKernels
from backend.structured_output.bitmask import PendingFill
from bench.bench_guided import PROMPTS, SCHEMA
from contracts.sampling_params import GuideSpec, SamplingParams

PHASES = {  # label -> (owner attribute path from the engine, method)
    "schedule": ("scheduler", "schedule"), "begin_fill": ("structured", "begin_fill"),
    "execute": ("runner", "execute"), "sample": ("runner", "sample"),
    "build_batch": ("runner.sampler", "build_batch"), "sampler.sample": ("runner.sampler", "sample"),
    "accept": ("structured", "accept"), "poll": ("structured.compiles", "poll"),
    "fill_bitmask": ("structured", "fill_bitmask"), "fill_rows": ("structured", "fill_rows"),
    "update_from_output": ("scheduler", "update_from_output"),
    "dispatch": ("outputs", "dispatch"), "step": ("", "step"),
}
CLASS_PHASES = {"PendingFill.result": (PendingFill, "result"), "kernels.masked_copy": (BitmaskKernels, "masked_copy"),
                "kernels.masked_argmax": (BitmaskKernels, "masked_argmax")}


def timer(fn, times: list[int]):
    def wrapped(*a, **k):
        t = time.perf_counter_ns()
        try:
            return fn(*a, **k)
        finally:
            times.append(time.perf_counter_ns() - t)
    return wrapped


def instrument(engine: LLMEngine, acc: dict[str, list[int]]) -> None:
    """Wrap every phase; the class-level ones stay wrapped for the process (this script's only)."""
    for label, (path, name) in PHASES.items():
        owner = engine
        for part in filter(None, path.split(".")):
            owner = getattr(owner, part)
        setattr(owner, name, timer(getattr(owner, name), acc[label]))
    backend = engine.structured.compiles.get_backend()
    backend.fill_bitmasks = timer(backend.fill_bitmasks, acc["fill_bitmasks (xgrammar)"])
    for label, (cls, name) in CLASS_PHASES.items():
        fn = getattr(cls, name)
        setattr(cls, name, lambda *a, _fn=fn, _t=acc[label], **k: timer(_fn, _t)(*a, **k))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(REPO / "models" / "demo-target"))
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--fast-decode", choices=("on", "off"), default="on")
    ap.add_argument("--fill", choices=("default", "worker", "loop"), default="default",
                    help="where the bitmask is filled (default: the engine's choice)")
    ap.add_argument("--loop-thread", action="store_true",
                    help="run the engine's loop and output threads, as served (default: steps on this thread)")
    args = ap.parse_args(argv)

    import torch

    from preprocess.tokenizer import load_tokenizer

    torch.set_grad_enabled(False)
    tokenizer = load_tokenizer(args.model)
    engine = LLMEngine(EngineConfig.from_settings(model_path=args.model, device="cpu", cpu_threads=1,
                                                  kv_cache_bytes=64 << 20, max_num_seqs=max(64, args.concurrency),
                                                  fast_decode=args.fast_decode == "on"))
    so = engine.structured
    so.compiles.warm_up()
    if args.fill != "default":
        so.fill_on_worker = args.fill == "worker"
    acc: dict[str, list[int]] = defaultdict(list)
    instrument(engine, acc)
    if args.loop_thread:
        engine.start()
    prompts = [tokenizer.encode(PROMPTS[i % len(PROMPTS)], add_special_tokens=True) for i in range(args.concurrency)]
    totals: dict[str, dict[str, list[int]]] = {"guided": defaultdict(list), "unguided": defaultdict(list)}
    for r in range(args.rounds):
        guided = [SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=1000 * r + i,
                                 guide=GuideSpec("json_schema", SCHEMA)) for i in range(len(prompts))]
        # seeded sampling is per sequence: a first guided pass (not counted) gives the twins' lengths
        lengths = [sum(len(o.new_token_ids) for o in out) for out in engine.generate(prompts, guided)]
        twins = [SamplingParams(max_tokens=n, temperature=1.0, seed=1000 * r + i, ignore_eos=True)
                 for i, n in enumerate(lengths)]
        order = [("guided", guided), ("unguided", twins)]
        for kind, params in (order if r % 2 == 0 else order[::-1]):   # alternating, as bench_guided.py
            for times in acc.values():
                times.clear()
            engine.generate(prompts, params)
            for label, times in acc.items():
                totals[kind][label] += times[2:] if label in ("step", "execute", "schedule") else times  # no prefill
    engine.shutdown()
    print(f"concurrency {args.concurrency}, fast decode {args.fast_decode}, "
          f"{'loop and output threads' if args.loop_thread else 'steps on the caller thread'}, bitmask filled "
          f"{'on a worker during the forward' if so.fill_on_worker else 'on the loop thread after the forward'}")
    print(f"{'phase (µs per call)':<26} {'guided median':>13} {'p90':>8} {'mean':>8} {'calls':>6}   "
          f"{'unguided median':>15} {'p90':>8} {'mean':>8} {'calls':>6}")
    for label in sorted(set(totals["guided"]) | set(totals["unguided"])):
        cells = []
        for kind in ("guided", "unguided"):
            t = totals[kind].get(label, [])
            p90 = sorted(t)[int(0.9 * len(t))] if t else 0
            cells.append(f"{statistics.median(t) / 1e3:>13.1f} {p90 / 1e3:>8.1f} {statistics.mean(t) / 1e3:>8.1f} "
                         f"{len(t):>6}" if t else f"{'-':>13} {'-':>8} {'-':>8} {0:>6}")
        print(f"{label:<26} {cells[0]}   {cells[1]:>40}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
