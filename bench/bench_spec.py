"""Speculative decoding benchmark: the same requests with none, ngram and draft (adaptive on and off),
in-process, at 1, 8 and 32 concurrent requests, greedy and temperature 0.8, on two workloads from
held-out code:

- ``repeat``: the output re-uses spans of the prompt, as in code editing or quoting: a snippet ``X``
  of held-out code, the target's own greedy continuation ``Y`` of it, a blank line, then ``X`` again
  (so the continuation the model is about to write is already in its context);
- ``mixed``: ``bench_engine.py``'s mixed workload (prompts cut anywhere, no planted repetition).

Prints, per cell, tokens/s and the ratio to ``none`` (with ``--rounds N``, every method runs N times, and the ratio
is the median of the per-round ratios, their range in brackets, then ``ci``: a distribution-free 90% confidence
interval of that median (``bench.harness.stats.median_interval``, from 5 rounds on; the goals are called met or not met only
where it lies on one side of the target, else "within the noise"). How the engines share the machine
(``--drive``): ``sliced`` (the default) runs every engine over the round's requests at once on this thread, in turns
of ``--slice-ms`` (20) of CPU time each (``bench/harness/sliced.py``; a round's turns in the next row of a balanced Latin
square), and counts tokens per second of each engine's own CPU time, so that a slow spell of the shared machine
(its cores' speed moves by 30-50% within a second) hits every engine alike: two identical engines read 0.99-1.01
per cell, against 0.92-1.11 with ``turns`` (docs/benchmarks.md, session 16); ``turns``: started engines (loop
threads, wall time) take turns every ``--chunk`` requests, 2c by default, in the orders of a balanced Latin
square (``turn_orders``: every method in every position and after every other equally often); ``--methods
none,none-again,...`` adds a second engine without speculation, whose ratio is the measurement's own
noise), the decode-speed ratio (median TPOT of ``none`` over the method's: the prompts' prefill, which speculation
does not touch, left out), the mean accepted length (tokens per verified step), the acceptance rate, and the measured costs behind
them (the adaptive policy's plain decode step time and extra seconds per speculating sequence for each
draft length at the cell's batch-size bucket; CPU time of the engine loop's thread, since the engines run
one thread, see backend/spec_decode/step_costs.py). For the draft model at batch 1 it also works out, from
those costs and the fixed-k acceptance, the speed-up to expect and the acceptance that would reach the
1.3x goal. Writes bench/results/spec.json and spec.png.

    .venv/bin/python bench/bench_spec.py [--quick] [--levels 1,8,32] [--rounds 5] [--workloads repeat] [--temperatures 0]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine, output_token_ids
from backend.core.buckets import bucket
from bench.harness.closed_loop import run_engine_level
from bench.harness.report import git_commit, goal_verdict, machine, write_json
from bench.harness.sliced import run_sliced
from bench.harness.stats import median_interval, summarize
from bench.harness.workload import corpus_ids, mixed_workload
from contracts.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
METHODS = {  # name -> EngineConfig overrides
    "none": {},
    # a second engine without speculation (not in the default methods): its ratio to `none` is the measurement's
    # own noise, the yardstick for the others' (an A/A test)
    "none-again": {},
    "ngram": {"speculative_method": "ngram"},
    "ngram-fixed": {"speculative_method": "ngram", "speculative_adaptive": False},
    "draft": {"speculative_method": "draft"},
    "draft-fixed": {"speculative_method": "draft", "speculative_adaptive": False},
}
GOALS = {("ngram", "repeat", 1, "greedy"): 2.0, ("draft", "mixed", 1, "greedy"): 1.3}
ADAPTIVE_FLOOR = 0.95


@dataclass(frozen=True)
class Item:
    prompt_ids: list[int]
    params: SamplingParams


def repeat_workload(tok: Tokenizer, engine: LLMEngine, n: int, seed: int, max_tokens: int) -> list[list[int]]:
    """``X + Y + blank line + X``: ``Y`` is the target's greedy continuation of the snippet ``X``."""
    ids, rng, bos = corpus_ids(tok, 16384), random.Random(seed), tok.token_to_id("<|bos|>")
    blank = tok.encode("\n\n", add_special_tokens=False).ids
    snippets = []
    for _ in range(n):
        start = rng.randrange(0, len(ids) - 400)
        snippets.append([bos] + ids[start:start + rng.randint(48, 128)])
    outs = engine.generate(snippets, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    return [x + output_token_ids(o) + blank + x[1:] for x, o in zip(snippets, outs)]


def items_for(prompts: list[list[int]], max_tokens: int, temperature: float) -> list[Item]:
    return [Item(p, SamplingParams(max_tokens=max_tokens, temperature=temperature, ignore_eos=True,
                                   seed=1000 + i if temperature else None)) for i, p in enumerate(prompts)]


def snapshot(engine: LLMEngine) -> tuple:
    """The counters ``measured_row`` takes differences of."""
    return dataclasses.replace(engine.scheduler.spec_counters.snapshot()), engine.stats()


def measure(engine: LLMEngine, items: list[Item], concurrency: int) -> dict:
    """The items through a started engine's closed loop (wall time)."""
    before = snapshot(engine)
    records, seconds = run_engine_level(engine, items, concurrency, level_seconds=1e9, request_timeout=300)
    return measured_row(engine, before, records, seconds, any_sampled(items))


def measure_sliced(engines: dict[str, LLMEngine], items: list[Item], concurrency: int, order: list[str],
                   slice_seconds: float) -> dict[str, dict]:
    """The items through every engine at once, in slices of ``slice_seconds`` (``bench/harness/sliced.py``): each row's
    seconds are its engine's own CPU time."""
    before = {m: snapshot(e) for m, e in engines.items()}
    runs = run_sliced(engines, items, concurrency, slice_seconds=slice_seconds, order=order)
    sampled = any_sampled(items)
    return {m: measured_row(engines[m], before[m], *runs[m], sampled, own_seconds=True) for m in engines}


def any_sampled(items: list[Item]) -> bool:
    """Some item samples (temperature > 0): the cell's steps read the policy's sampled costs."""
    return any(it.params.temperature > 0 for it in items)


def measured_row(engine: LLMEngine, before: tuple, records, seconds: float, sampled: bool,
                 own_seconds: bool = False) -> dict:
    """A measurement's row: tokens/s, TPOT, steps, drafts, acceptance and the policy's costs (of sampled steps
    where ``sampled``). ``own_seconds``: the seconds are the engine's own CPU time (a sliced run), so they are its
    loop's CPU time too."""
    counters0, stats0 = before
    stats1 = engine.stats()
    s = summarize(records, seconds)
    spec = engine.scheduler.spec_counters
    drafts = spec.num_draft_tokens - counters0.num_draft_tokens
    accepted = spec.num_accepted_tokens - counters0.num_accepted_tokens
    verifies = spec.num_drafts - counters0.num_drafts
    if own_seconds:
        loop_cpu = seconds
    else:   # the loop thread's time on a core: with one thread it runs the whole step, forward included
        loop_cpu = stats1.loop.cpu_s - stats0.loop.cpu_s if stats0.loop and stats1.loop else None
    row = {"tok_per_s": s["tok_per_s"], "seconds": seconds, "tpot_ms_p50": s["tpot_ms"]["p50"],
           "ttft_ms_p50": s["ttft_ms"]["p50"],
           "steps": stats1.steps - stats0.steps, "output_tokens": s["output_tokens"],
           "loop_cpu_s": loop_cpu,
           "draft_tokens": drafts, "accepted_tokens": accepted,
           "acceptance_rate": accepted / drafts if drafts else None,
           "mean_accepted_length": 1 + accepted / verifies if verifies else 1.0, "errors": s["errors"],
           "verifies": verifies}
    if engine.speculator is not None:
        policy = engine.speculator.policy     # the costs of the cell's kind of steps: sampled or greedy
        costs = policy.costs_for(sampled)
        plain, extra = costs.snapshot()
        row["plain_step_ms"] = {b: 1e3 * v for b, v in plain.items()}
        row["extra_ms_per_seq"] = {b: {k: 1e3 * v for k, v in by_k.items()} for b, by_k in extra.items()}
    return row


def turn_orders(n: int) -> list[list[int]]:
    """A balanced (Williams) Latin square of ``n`` engines' turns: over its rows every engine takes every position
    equally often, and follows every other engine equally often (``n`` rows for an even ``n``, ``2n`` for an odd
    one). Turn ``t`` of a cell takes row ``t % len(rows)``. Forward and backward in turn, as before, left two
    engines always at the ends (the first followed itself at every round's turn, warm) and two always in the
    middle, the n-gram engine always next to the fixed-k one; the matrices put a sampled batch-8 cell, where the
    adaptive engine did ``none``'s work, at 0.84-0.94 against its A/A's 0.97-0.99 (docs/benchmarks.md, session 13)."""
    if n < 1:
        raise ValueError(f"turn_orders: need at least one engine, got {n}")
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:                      # 0, 1, n-1, 2, n-2, ...
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(j + i) % n for j in first] for i in range(n)]
    return rows if n % 2 == 0 else rows + [row[::-1] for row in rows]


def request_chunks(items: list[Item], size: int) -> list[list[Item]]:
    """``items`` in consecutive chunks of ``size`` (the last one possibly shorter)."""
    return [items[i:i + size] for i in range(0, len(items), size)]


def combine(rounds: list[dict]) -> dict:
    """One row from measurements (rounds over the same items, or a round's chunks): tok/s over the total time,
    counters and seconds summed, TPOT and TTFT their medians."""
    row = dict(rounds[-1])
    row["seconds"] = sum(r["seconds"] for r in rounds)
    row["tok_per_s"] = sum(r["tok_per_s"] * r["seconds"] for r in rounds) / row["seconds"]
    for key in ("tpot_ms_p50", "ttft_ms_p50"):
        row[key] = statistics.median(r[key] for r in rounds)
    for key in ("steps", "draft_tokens", "accepted_tokens", "errors", "output_tokens"):
        row[key] = sum(r[key] for r in rounds)
    cpu = [r["loop_cpu_s"] for r in rounds]
    row["loop_cpu_s"] = None if None in cpu else sum(cpu)
    row["cpu_tok_per_s"] = row["output_tokens"] / row["loop_cpu_s"] if row["loop_cpu_s"] else None
    verifies = sum(r["verifies"] for r in rounds)
    row["verifies"] = verifies
    row["acceptance_rate"] = row["accepted_tokens"] / row["draft_tokens"] if row["draft_tokens"] else None
    row["mean_accepted_length"] = 1 + row["accepted_tokens"] / verifies if verifies else 1.0
    return row


def cell_name(cell: dict) -> str:
    return f"{cell['method']} {cell['workload']} T={cell['temperature']:g} c={cell['concurrency']}"


def interval_text(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f" [90% CI of the median {ci[0]:.2f}-{ci[1]:.2f}]"


def goal_verdicts(cells: list[dict]) -> list[dict]:
    """The goals (``GOALS``, ``ADAPTIVE_FLOOR``) against the cells' median ratios and their 90% confidence intervals
    (``bench.harness.report.goal_verdict``: ``met`` / ``not met`` only where the interval lies on one side of the target). The
    floor's row reads the lowest adaptive cell and lists the cells whose whole interval lies below the floor."""
    verdicts = []

    def row(goal: str, cell: dict, target: float) -> dict:
        cpu = cell.get("cpu_ratio")
        return {"goal": goal, "cell": cell_name(cell), "ratio": cell["ratio"], "ratio_ci": cell.get("ratio_ci"),
                "target": target, "met": cell["ratio"] >= target,
                "verdict": goal_verdict(cell["ratio"], cell.get("ratio_ci"), target),
                "cpu_ratio": cpu, "cpu_ratio_ci": cell.get("cpu_ratio_ci"),
                "cpu_verdict": None if cpu is None else goal_verdict(cpu, cell.get("cpu_ratio_ci"), target)}

    for (m, wl, c, mode), goal in GOALS.items():
        for cell in cells:
            if (cell["method"], cell["workload"], cell["concurrency"], cell["temperature"] == 0.0) == \
                    (m, wl, c, mode == "greedy"):
                verdicts.append(row(f"{m} {wl} c={c} {mode} >= {goal}x", cell, goal))
    adaptive = [c for c in cells if c["method"] in ("ngram", "draft") and c["ratio"] is not None]
    if adaptive:
        lowest = min(adaptive, key=lambda c: c["ratio"])
        floor = row(f"adaptive >= {ADAPTIVE_FLOOR}x of none everywhere", lowest, ADAPTIVE_FLOOR)
        on_cpu = [c["cpu_ratio"] for c in adaptive if c.get("cpu_ratio") is not None]
        if on_cpu:   # the lowest cell on CPU time may be another one
            low_cpu = min((c for c in adaptive if c.get("cpu_ratio") is not None), key=lambda c: c["cpu_ratio"])
            floor.update(cpu_ratio=low_cpu["cpu_ratio"], cpu_ratio_ci=low_cpu.get("cpu_ratio_ci"),
                         cpu_verdict=goal_verdict(low_cpu["cpu_ratio"], low_cpu.get("cpu_ratio_ci"), ADAPTIVE_FLOOR))
        floor["clearly_below"] = [cell_name(c) for c in adaptive
                                  if c.get("ratio_ci") is not None and c["ratio_ci"][1] < ADAPTIVE_FLOOR]
        if not all(c.get("ratio_ci") for c in adaptive):   # a cell without an interval cannot be called clear
            floor["verdict"] = goal_verdict(lowest["ratio"], None, ADAPTIVE_FLOOR)
        elif floor["clearly_below"]:
            floor["verdict"] = "not met"
        else:   # met only if every cell's interval lies at or above the floor
            lows = [c["ratio_ci"][0] for c in adaptive]
            floor["verdict"] = "met" if min(lows) >= ADAPTIVE_FLOOR else \
                goal_verdict(lowest["ratio"], None, ADAPTIVE_FLOOR)
        verdicts.append(floor)
    return verdicts


def cost_summary(row: dict, bucket: int) -> str:
    """``plain 2.1 ms, +k1 0.9 +k4 2.0 ms/seq`` for one batch bucket (adaptive policy's measurements)."""
    plain = row.get("plain_step_ms", {}).get(bucket)
    extra = row.get("extra_ms_per_seq", {}).get(bucket, {})
    if plain is None:
        return ""
    return f"plain {plain:.2f} ms" + ("".join(f" +k{k} {v:.2f}" for k, v in extra.items()) + " ms/seq" if extra else "")


def geometric_accepted(a: float, k: int) -> float:
    """``E(k)`` with the same acceptance ``a`` at every position: ``a + a^2 + ... + a^k``."""
    return sum(a ** i for i in range(1, k + 1))


def solve_increasing(f, target: float) -> float | None:
    """The ``a`` in [0, 1] with ``f(a) = target`` for ``f`` increasing on [0, 1]; None if out of reach."""
    if f(1.0) < target:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return hi


def prefill_share(none_row: dict, max_tokens: int) -> float:
    """The share of a batch-1 request's time that is its prompt's prefill, from ``none``'s medians: ``TTFT / (TTFT
    + TPOT * (max_tokens - 1))``. Speculation does not shorten it."""
    ttft, tpot = none_row.get("ttft_ms_p50"), none_row.get("tpot_ms_p50")
    if not ttft or not tpot:
        return 0.0
    return ttft / (ttft + tpot * (max_tokens - 1))


def overall_speedup(decode_speedup: float, prefill: float) -> float:
    """Tokens/s ratio when decoding runs ``decode_speedup`` times faster and ``prefill`` of the time does not."""
    return 1.0 / (prefill + (1.0 - prefill) / decode_speedup)


def decode_speedup_for(goal: float, prefill: float) -> float | None:
    """The decode speed-up that makes ``overall_speedup`` reach ``goal`` (None: the prefill alone forbids it)."""
    return None if 1.0 / goal <= prefill else (1.0 - prefill) / (1.0 / goal - prefill)


def goal_analysis(measured: dict, fixed: dict | None, k_max: int, goal: float, prefill: float = 0.0) -> dict | None:
    """Why a batch-1 cell misses ``goal`` from its measured costs, acceptance and prefill share, and what would
    reach it.

    Costs at bucket 1 from ``measured`` (the fixed-k engine when there is one: it speculates every step, so its
    costs rest on the most steps): ``r_k = x(1, k) / t(1)``, the extra seconds of speculating with ``k``
    drafts (proposer included) per plain step; the decode speed-up with per-position acceptance ``a`` is
    ``(1 + E(k)) / (1 + r_k)``, and tokens/s also pay the prompts' prefill (``prefill`` of ``none``'s time,
    ``overall_speedup``). Acceptance ``a`` from the fixed-k engine's mean accepted length.
    """
    plain = measured.get("plain_step_ms", {}).get(1)
    extra = measured.get("extra_ms_per_seq", {}).get(1, {})
    if not plain or not extra:
        return None
    ratio = {k: x / plain for k, x in extra.items()}
    need = decode_speedup_for(goal, prefill)
    out: dict = {"plain_step_ms": plain, "extra_per_plain_step": ratio, "prefill_share": prefill,
                 "decode_speedup_for_goal": need}
    if fixed is not None and fixed["draft_tokens"]:
        a = solve_increasing(lambda v: geometric_accepted(v, k_max), fixed["mean_accepted_length"] - 1) or 1.0
        out["per_position_acceptance"] = a
        out["predicted_speedup"] = {k: overall_speedup((1 + geometric_accepted(a, k)) / (1 + r), prefill)
                                    for k, r in ratio.items()}
        out["max_extra_for_goal"] = {k: max(0.0, (1 + geometric_accepted(a, k)) / need - 1) if need else None
                                     for k in ratio}
    out["acceptance_for_goal"] = {k: solve_increasing(lambda v, k=k: 1 + geometric_accepted(v, k), need * (1 + r))
                                  if need else None for k, r in ratio.items()}
    out["best_with_every_draft_accepted"] = max(overall_speedup((1 + k) / (1 + r), prefill) for k, r in ratio.items())
    return out


def rounded(value):
    """``value`` with its floats to 2 decimals (dicts and lists walked), for printing."""
    if isinstance(value, float):
        return round(value, 2)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


def plot(cells: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = sorted({(c["workload"], c["temperature"]) for c in cells})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (wl, temp) in zip(axes[0], panels):
        for m in METHODS:
            pts = sorted((c["concurrency"], c["ratio"]) for c in cells
                         if c["workload"] == wl and c["temperature"] == temp and c["method"] == m)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{wl}, {temp}")
        ax.set_xlabel("concurrent requests")
    axes[0][0].set_ylabel("tokens/s vs none")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models/demo-target"))
    ap.add_argument("--draft", default=str(ROOT / "models/demo-draft"))
    ap.add_argument("--levels", default="1,8,32")
    ap.add_argument("--methods", default=",".join(m for m in METHODS if m != "none-again"),
                    help="of " + ", ".join(METHODS) + " (none-again: a second engine without speculation, the A/A "
                         "control)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fast-decode", choices=("on", "off"), default="on", help="EngineConfig.fast_decode (shipped: on)")
    ap.add_argument("--quick", action="store_true", help="fewer and shorter requests")
    ap.add_argument("--workloads", default="repeat,mixed")
    ap.add_argument("--temperatures", default="0,0.8")
    ap.add_argument("--requests", type=int, default=0,
                    help="at least this many requests per cell (else twice the concurrency, at least 16; with "
                         "--quick, the concurrency): at batch 1 the first four `repeat` prompts are the friendliest "
                         "(n-gram 1.81-2.15x on them against 1.36-1.50x on sixteen, docs/benchmarks.md)")
    ap.add_argument("--rounds", type=int, default=1, help="measure each cell this many times, alternating the order")
    ap.add_argument("--chunk", type=int, default=0,
                    help="within a round, the methods take turns every this many requests (0: twice the "
                         "concurrency, at least 2), so that a slow spell of the machine hits them alike")
    ap.add_argument("--drive", choices=("sliced", "turns"), default="sliced",
                    help="sliced: every round runs all engines at once on this thread, in turns of --slice-ms of CPU "
                         "time each (bench/harness/sliced.py; tok/s on each engine's own CPU time); turns: started engines "
                         "(loop threads, wall time) take turns every --chunk requests")
    ap.add_argument("--slice-ms", type=float, default=20.0, help="with --drive sliced, the length of a turn")
    ap.add_argument("--out", default=str(ROOT / "bench/results"))
    args = ap.parse_args(argv)
    workloads = args.workloads.split(",")
    if args.rounds < 1 or args.requests < 0 or args.chunk < 0 or not set(workloads) <= {"repeat", "mixed"}:
        ap.error("--rounds must be >= 1, --requests and --chunk >= 0 and --workloads a subset of repeat,mixed")
    if args.drive == "sliced" and (args.threads != 1 or args.slice_ms <= 0):
        ap.error("--drive sliced times each engine on this thread's CPU clock: it needs --threads 1 and --slice-ms > 0")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    levels = [int(x) for x in args.levels.split(",")]
    max_tokens = 48 if args.quick else 96
    # the repeat workload's continuations come from an engine of their own: generating them in the `none`
    # engine would leave the prompts' prefixes in its prefix cache, a head start on prefill over the others.
    # It is built first: the first engine a process builds ran slower than identical ones built after it (A/A with
    # `none` first 1.02 / 1.12 at T=0.8 batch 1 / 8, with `none-again` first 0.97 / 0.94, with the writer first
    # 1.00 / 1.00; docs/benchmarks.md, session 14), and built after the engines it had left `none` that handicap
    writer = LLMEngine(EngineConfig(model_path=args.model, device="cpu", fast_decode=args.fast_decode == "on")).start()
    engines = {}
    for m in args.methods.split(","):
        cfg = dict(model_path=args.model, device="cpu", cpu_threads=args.threads, kv_cache_bytes=256 << 20,
                   num_speculative_tokens=args.k, fast_decode=args.fast_decode == "on", **METHODS[m])
        if "draft" in m:
            cfg["draft_model_path"] = args.draft
        engines[m] = LLMEngine(EngineConfig(**cfg))
        if args.drive == "turns":
            engines[m].start()
    builders = {"repeat": lambda: repeat_workload(tok, writer, 64, 1, max_tokens),
                "mixed": lambda: [r.prompt_ids for r in mixed_workload(tok, 64, 2, (16, 384), (max_tokens, max_tokens))]}
    try:
        prompts = {wl: builders[wl]() for wl in workloads}
    finally:
        writer.shutdown()
    cells = []
    t0 = time.perf_counter()
    try:
        for wl in workloads:
            ps = prompts[wl]
            for temp in (float(t) for t in args.temperatures.split(",")):
                for c in levels:
                    n = max(args.requests, max(2 * c, 16) if not args.quick else max(c, 2))
                    items = items_for(ps[:n], max_tokens, temp)
                    runs: dict[str, list[dict]] = {m: [] for m in engines}
                    names, orders = list(engines), turn_orders(len(engines))
                    if args.drive == "sliced":
                        slice_s = args.slice_ms / 1e3
                        measure_sliced(engines, items[:min(2, n)], 2, names, slice_s)   # warm-up
                        for r in range(args.rounds):                  # each round's slices in the next order
                            parts = measure_sliced(engines, items, c, [names[j] for j in orders[r % len(orders)]],
                                                   slice_s)
                            for m, measured in parts.items():
                                runs[m].append(combine([measured]))
                    else:
                        for eng in engines.values():                  # warm-up: shapes, caches, measured costs
                            run_engine_level(eng, items[:min(2, n)], 2, level_seconds=1e9, request_timeout=300)
                        chunks = request_chunks(items, args.chunk or max(2 * c, 2))
                        for r in range(args.rounds):
                            turns: dict[str, list[dict]] = {m: [] for m in engines}
                            for i, chunk in enumerate(chunks):        # balanced turns against load drift
                                for j in orders[(r * len(chunks) + i) % len(orders)]:
                                    turns[names[j]].append(measure(engines[names[j]], chunk, c))
                            for m, measured in turns.items():
                                runs[m].append(combine(measured))
                    rows = {m: combine(rs) for m, rs in runs.items()}
                    base = rows["none"]["tok_per_s"] if "none" in rows else None
                    for m, r in rows.items():
                        # per round, the ratio to none measured next to it (the same round); their median
                        # is robust to another process slowing one run down
                        paired = [x["tok_per_s"] / b["tok_per_s"] for x, b in zip(runs[m], runs.get("none", []))]
                        # decode speed alone (the prompts' prefill left out): the ratio of median TPOTs
                        decode = [b["tpot_ms_p50"] / x["tpot_ms_p50"] for x, b in zip(runs[m], runs.get("none", []))]
                        # the same on the loop thread's CPU time (one thread: the whole step), which time another
                        # process took the core from the engine does not enter
                        cpu_paired = [x["cpu_tok_per_s"] / b["cpu_tok_per_s"]
                                      for x, b in zip(runs[m], runs.get("none", []))
                                      if x["cpu_tok_per_s"] and b["cpu_tok_per_s"]] if args.threads == 1 else []
                        r.update(method=m, workload=wl, temperature=temp, concurrency=c,
                                 ratio=statistics.median(paired) if paired else None, round_ratios=paired,
                                 cpu_ratio=statistics.median(cpu_paired) if cpu_paired else None,
                                 cpu_round_ratios=cpu_paired,
                                 ratio_ci=median_interval(paired) if paired else None,
                                 cpu_ratio_ci=median_interval(cpu_paired) if cpu_paired else None,
                                 decode_ratio=statistics.median(decode) if decode else None,
                                 pooled_ratio=r["tok_per_s"] / base if base else None)
                        cells.append(r)
                        acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
                        spread = f"[{min(r['round_ratios']):.2f}-{max(r['round_ratios']):.2f}]" if r["round_ratios"] else ""
                        ci = r["ratio_ci"]
                        spread += f" ci {ci[0]:.2f}-{ci[1]:.2f}" if ci and m != "none" else ""
                        on_cpu = f"cpu x{r['cpu_ratio']:4.2f} [{min(cpu_paired):.2f}-{max(cpu_paired):.2f}]" \
                            if cpu_paired else ""
                        print(f"{wl:6s} T={temp:.1f} c={c:<3d} {m:12s} {r['tok_per_s']:8.1f} tok/s  "
                              f"x{(r['ratio'] or 0):5.2f} {spread:21s} {on_cpu:22s} decode x{(r['decode_ratio'] or 0):4.2f}  accepted len {r['mean_accepted_length']:.2f}  "
                              f"acceptance {acc}  steps {r['steps']}  {cost_summary(r, bucket(c))}",
                              flush=True)
    finally:
        for eng in engines.values():
            eng.shutdown()
    verdicts = goal_verdicts(cells)
    for v in verdicts:
        print(f"goal {v['goal']}: {v['ratio']:.3f} {v['verdict']}{interval_text(v['ratio_ci'])}"
              + ("" if v["cpu_ratio"] is None else f" (on the loop thread's CPU time: {v['cpu_ratio']:.3f}, "
                 f"{v['cpu_verdict']}{interval_text(v['cpu_ratio_ci'])})")
              + (f"; cells below {v['target']} however the noise falls: {', '.join(v['clearly_below']) or 'none'}"
                 if "clearly_below" in v else ""))
    for key, label in (("ratio", "tok/s"), ("cpu_ratio", "on CPU time")):
        control = [c[key] for c in cells if c["method"] == "none-again" and c[key] is not None]
        if control:   # what the same engine reads against itself: differences inside this range are noise
            print(f"A/A control (none-again / none), {label}: {min(control):.2f}-{max(control):.2f} "
                  f"over {len(control)} cells")
    analysis = {}
    for wl, temp in sorted({(c["workload"], c["temperature"]) for c in cells}):
        at1 = {c["method"]: c for c in cells if (c["workload"], c["temperature"], c["concurrency"]) == (wl, temp, 1)}
        prefill = prefill_share(at1["none"], max_tokens) if "none" in at1 else 0.0
        for method in ("ngram", "draft"):
            if method not in at1:
                continue
            goal = next(g for (m, *_), g in GOALS.items() if m == method)   # the method's batch-1 goal
            fixed = at1.get(f"{method}-fixed")
            found = goal_analysis(fixed or at1[method], fixed, args.k, goal, prefill)
            if found:
                analysis[f"{method} {wl} T={temp:g} c=1"] = found
                print(f"{method} {wl} T={temp:g} c=1 (goal {goal}x): {rounded(found)}")
    plot(cells, out / "spec.png")
    write_json(out / "spec.json", {"cells": cells, "goals": verdicts, "goal_analysis": analysis,
                                   "machine": machine(load), "commit": git_commit(),
                                   "seconds": time.perf_counter() - t0})
    print(f"wrote {out / 'spec.json'} and {out / 'spec.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
