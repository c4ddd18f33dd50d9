"""Guided versus unguided decoding in the in-process engine: TPOT ratio at several concurrencies,
grammar compile time cold and cached, and where the guided step's extra time goes.

    python -m bench.bench_guided                       # demo model, CPU, 1 and 32 concurrent
    python -m bench.bench_guided --concurrency 1 8 32 --max-tokens 64 --json out.json

Fairness: guided requests are sampled with seeds (a JSON schema); each unguided twin gets exactly
its guided twin's output length (``max_tokens`` = that length, ``ignore_eos``), so both runs have
the same batch composition step by step and differ only by the grammar work. Each round runs the
two back to back, guided first in even rounds and second in odd ones; ratios are within one run.
Standalone: imports only the engine and the grammar layer.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from contracts.sampling_params import GuideSpec, SamplingParams

SCHEMA = json.dumps({
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 4},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
    },
    "required": ["name", "age", "tags", "address"], "additionalProperties": False,
})
PROMPTS = ["# a person record as JSON\nperson = ", "def load():\n    return ", "config = ", "data = "]


def run_round(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]) -> list[dict]:
    """Submit all at once; per request: output tokens and the arrival time of each output."""
    n = len(prompts)
    records = [{"times": [], "tokens": 0, "reason": None} for _ in range(n)]
    done = threading.Semaphore(0)
    start = time.perf_counter()

    def cb(i):
        def on_output(out):
            now = time.perf_counter()
            rec = records[i]
            rec["times"].extend([now] * len(out.new_token_ids))
            rec["tokens"] += len(out.new_token_ids)
            if out.request_finished:
                rec["reason"] = out.finish_reason.value if out.finish_reason else None
                rec["error"] = out.error
                done.release()
        return on_output

    tag = f"b{time.monotonic_ns()}"
    for i, (p, sp) in enumerate(zip(prompts, params)):
        records[i]["rid"] = f"{tag}-{i}"
        engine.add_request(f"{tag}-{i}", p, sp, cb(i))
    for _ in range(n):
        done.acquire()
    for rec in records:
        rec["ttft"] = rec["times"][0] - start
        rec["tpot"] = (rec["times"][-1] - rec["times"][0]) / (rec["tokens"] - 1) if rec["tokens"] > 1 else None
    return records


def timed(obj, name: str, acc: dict) -> None:
    """Wrap ``obj.name`` (an instance attribute shadowing the method; ``del`` restores it) to add its
    wall time to ``acc[name]``."""
    fn = getattr(type(obj), name).__get__(obj)

    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[name] = acc.get(name, 0.0) + time.perf_counter() - t
    setattr(obj, name, wrapper)


def twin_runs(engine, prompts: list[list[int]], seeds: list[int], max_tokens: int, compare_fill: bool,
              reverse: bool, steps: dict[str, int]) -> tuple[list[int], dict[str, list[dict]]]:
    """One round: a calibration run of the guided requests, then each kind timed (``guided``, its ``plain``
    unguided twins of the same lengths, ``guided_other_fill`` with ``compare_fill``), in the reverse order when
    ``reverse``. Seeded sampling is per sequence, so a guided request's output (and length) does not depend on
    the batch. Adds each kind's engine steps to ``steps``; returns the lengths and each kind's records."""
    so = engine.structured
    gparams = [SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=s, guide=GuideSpec("json_schema", SCHEMA))
               for s in seeds]
    s0 = engine.stats().steps
    lens = [g["tokens"] for g in run_round(engine, prompts, gparams)]
    steps["calibration"] += engine.stats().steps - s0
    uparams = [SamplingParams(max_tokens=n, temperature=1.0, seed=s, ignore_eos=True) for s, n in zip(seeds, lens)]
    timed_runs = {}
    kinds = ["guided", "plain"] + (["guided_other_fill"] if compare_fill else [])
    default_fill = so.fill_on_worker
    for kind in (kinds[::-1] if reverse else kinds):
        s0 = engine.stats().steps
        so.fill_on_worker = default_fill != (kind == "guided_other_fill")
        timed_runs[kind] = run_round(engine, prompts, uparams if kind == "plain" else gparams)
        so.fill_on_worker = default_fill
        steps[kind] = steps.get(kind, 0) + engine.stats().steps - s0
    return lens, timed_runs


def bench_concurrency(engine, tokenizer, c: int, max_tokens: int, rounds: int, seed: int,
                      compare_fill: bool = False) -> dict:
    prompts = [tokenizer.encode(PROMPTS[i % len(PROMPTS)], add_special_tokens=True) for i in range(c)]
    so = engine.structured
    acc: dict[str, float] = {}
    for name in ("fill_bitmask", "fill_rows", "accept"):   # fill_rows: steps without drafts
        timed(so, name, acc)
    passes: dict[str, int] = {}                 # request id -> forward passes it took part in
    schedule = engine.scheduler.schedule

    def counting_schedule():
        plan = schedule()
        for sc in plan.scheduled:
            passes[sc.seq.request_id] = passes.get(sc.seq.request_id, 0) + 1
        return plan
    engine.scheduler.schedule = counting_schedule
    steps: dict[str, int] = {"calibration": 0}   # calibration runs are guided too: the grammar timers run in them
    g_tpot, u_tpot, g_ttft, lengths, stops, ratios, g_passes, u_passes = [], [], [], [], 0, [], [], []
    other_ratios: list[float] = []             # guided with the other bitmask fill (worker vs loop thread) / plain
    for r in range(rounds):
        lens, timed_runs = twin_runs(engine, prompts, [seed + 1000 * r + i for i in range(c)], max_tokens,
                                     compare_fill, reverse=r % 2 == 1, steps=steps)
        guided, plain = timed_runs["guided"], timed_runs["plain"]
        if compare_fill:
            other = [g["tpot"] for g in timed_runs["guided_other_fill"] if g["tpot"]]
            other_ratios.append(statistics.mean(other) / statistics.mean([u["tpot"] for u in plain if u["tpot"]]))
        assert all(g.get("error") is None for g in guided), [g.get("error") for g in guided]
        assert [g["tokens"] for g in guided] == lens == [u["tokens"] for u in plain]
        g_passes += [passes[g["rid"]] for g in guided]
        u_passes += [passes[u["rid"]] for u in plain]
        g_round = [g["tpot"] for g in guided if g["tpot"]]
        u_round = [u["tpot"] for u in plain if u["tpot"]]
        ratios.append(statistics.mean(g_round) / statistics.mean(u_round))
        g_tpot += g_round
        u_tpot += u_round
        g_ttft += [g["ttft"] for g in guided]
        lengths += lens
        stops += sum(g["reason"] == "stop" for g in guided)
    engine.scheduler.schedule = schedule
    for name in ("fill_bitmask", "fill_rows", "accept"):   # fill_rows: steps without drafts
        delattr(so, name)
    gt, ut = statistics.mean(g_tpot), statistics.mean(u_tpot)
    guided_steps = max(1, steps["guided"] + steps.get("guided_other_fill", 0) + steps["calibration"])
    return {"concurrency": c, "rounds": rounds, "requests": c * rounds, "finished_stop": stops,
            "mean_output_tokens": statistics.mean(lengths), "tpot_guided_ms": 1e3 * gt, "tpot_unguided_ms": 1e3 * ut,
            "tpot_ratio": gt / ut, "tpot_ratio_per_round": ratios, "tpot_ratio_median": statistics.median(ratios),
            "steps_guided": steps["guided"], "steps_unguided": steps["plain"],
            "fill_bitmask_ms_per_step": 1e3 * (acc.get("fill_bitmask", 0) + acc.get("fill_rows", 0)) / guided_steps,
            "accept_ms_per_step": 1e3 * acc.get("accept", 0) / guided_steps,
            "mean_ttft_guided_ms": 1e3 * statistics.mean(g_ttft),
            "forward_passes_per_request_guided": statistics.mean(g_passes),
            "forward_passes_per_request_unguided": statistics.mean(u_passes),
            "fill_on_worker": so.fill_on_worker,
            "tpot_ratio_other_fill_per_round": other_ratios,
            "spec_accepted_per_draft": spec_rate(engine)}


def spec_rate(engine) -> float | None:
    """Accepted drafts per verified draft so far (None without speculation)."""
    spec = engine.scheduler.spec_counters
    return spec.num_accepted_tokens / spec.num_draft_tokens if spec.num_draft_tokens else None


def bench_compile(model_path: Path) -> list[dict]:
    from grammar import XGrammarBackend
    from bench.harness.guides import all_guides

    backend = XGrammarBackend.from_folder(model_path, 4096 if "demo" in str(model_path) else None, [1])
    rows = []
    for name, kind, text in all_guides() + [("bench:person", "json_schema", SCHEMA)]:
        t = time.perf_counter()
        backend.compile(kind, text)
        cold = time.perf_counter() - t
        t = time.perf_counter()
        backend.compile(kind, text)
        cached = time.perf_counter() - t
        rows.append({"guide": name, "cold_ms": 1e3 * cold, "cached_ms": 1e3 * cached})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(REPO / "models" / "demo-target"))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cpu-threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-jump-forward", action="store_true", help="skip the guided_jump_forward=true run")
    ap.add_argument("--fast-decode", choices=("on", "off"), default="on", help="llm.fast_decode (shipped: on)")
    ap.add_argument("--speculative-method", default="none", choices=["none", "ngram", "draft"])
    ap.add_argument("--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--draft-model", default=str(REPO / "models" / "demo-draft"))
    ap.add_argument("--compare-fill", action="store_true",
                    help="also time guided rounds with the other bitmask fill (worker thread vs loop thread)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    from preprocess.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    def make_engine(jump_forward: bool) -> LLMEngine:
        spec = {} if args.speculative_method == "none" else {
            # adaptive k follows timings, and a seeded request must reproduce its length across the rounds
            "speculative_method": args.speculative_method, "num_speculative_tokens": args.num_speculative_tokens,
            "speculative_adaptive": False,
            **({"draft_model_path": args.draft_model} if args.speculative_method == "draft" else {})}
        return LLMEngine(EngineConfig.from_settings(model_path=args.model, device=args.device,
                                                    cpu_threads=args.cpu_threads, kv_cache_bytes=64 << 20,
                                                    max_num_seqs=max(64, max(args.concurrency)),
                                                    guided_jump_forward=jump_forward,
                                                    fast_decode=args.fast_decode == "on", **spec))

    engine = make_engine(False)
    t = time.perf_counter()
    engine.structured.compiles.warm_up()
    warm = time.perf_counter() - t
    engine.start()
    try:
        run_round(engine, [tokenizer.encode("x = ")], [SamplingParams(max_tokens=4, guide=GuideSpec("json_schema",
                                                                                                     SCHEMA))])
        results = {"model": args.model, "device": args.device, "cpu_threads": args.cpu_threads,
                   "grammar_layer_start_s": warm,
                   "speculative_method": args.speculative_method,
                   "tpot": [bench_concurrency(engine, tokenizer, c, args.max_tokens, args.rounds, args.seed,
                                              compare_fill=args.compare_fill) for c in args.concurrency],
                   "compile": bench_compile(Path(args.model))}
    finally:
        engine.shutdown()
    if not args.no_jump_forward:
        engine = make_engine(True)
        engine.structured.compiles.warm_up()
        engine.start()
        try:
            results["jump_forward"] = [bench_concurrency(engine, tokenizer, c, args.max_tokens, args.rounds, args.seed)
                                       for c in args.concurrency]
        finally:
            engine.shutdown()
    print(f"grammar layer start-up (xgrammar import, tokenizer view): {warm:.2f} s")
    print(f"{'conc':>4} {'reqs':>5} {'stop':>5} {'tokens':>6} {'TPOT guided':>12} {'TPOT plain':>11} {'ratio':>6} "
          f"{'median':>6} {'fill/step':>10} {'accept/step':>11}")
    for r in results["tpot"]:
        print(f"{r['concurrency']:>4} {r['requests']:>5} {r['finished_stop']:>5} {r['mean_output_tokens']:>6.1f} "
              f"{r['tpot_guided_ms']:>10.2f}ms {r['tpot_unguided_ms']:>9.2f}ms {r['tpot_ratio']:>6.3f} "
              f"{r['tpot_ratio_median']:>6.3f} "
              f"{r['fill_bitmask_ms_per_step']:>8.3f}ms {r['accept_ms_per_step']:>9.3f}ms")
    for r in results["tpot"]:
        if r["tpot_ratio_other_fill_per_round"]:
            modes = ("on a worker during the forward", "on the loop thread after the forward")
            first, second = modes if r["fill_on_worker"] else modes[::-1]
            print(f"  c={r['concurrency']}: ratio per round, bitmask filled {first} (default here) "
                  f"{[round(x, 3) for x in r['tpot_ratio_per_round']]}, {second} "
                  f"{[round(x, 3) for x in r['tpot_ratio_other_fill_per_round']]}")
        if r["spec_accepted_per_draft"] is not None:
            print(f"  c={r['concurrency']}: {args.speculative_method} speculation, accepted per draft so far "
                  f"{r['spec_accepted_per_draft']:.2f}")
    print("forward passes per request (guided / its unguided twin of the same length):")
    for r in results["tpot"]:
        print(f"  c={r['concurrency']}: {r['forward_passes_per_request_guided']:.1f} / "
              f"{r['forward_passes_per_request_unguided']:.1f}")
    for r in results.get("jump_forward", []):
        print(f"  c={r['concurrency']} with guided_jump_forward: {r['forward_passes_per_request_guided']:.1f} / "
              f"{r['forward_passes_per_request_unguided']:.1f} ({r['mean_output_tokens']:.1f} tokens), "
              f"TPOT {r['tpot_guided_ms']:.2f} ms vs {r['tpot_unguided_ms']:.2f} ms: ratio {r['tpot_ratio']:.3f} "
              f"(median {r['tpot_ratio_median']:.3f})")
    print(f"{'guide':<30} {'cold':>9} {'cached':>9}")
    for r in results["compile"]:
        print(f"{r['guide']:<30} {r['cold_ms']:>7.2f}ms {r['cached_ms']:>7.3f}ms")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
