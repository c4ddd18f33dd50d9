"""Speculative decoding benchmark: the same requests with none, ngram and draft (adaptive and fixed k), in-process,
at 1, 8 and 32 concurrent requests, greedy and temperature 0.8, on two workloads from held-out code:

- ``repeat``: the output re-uses spans of the prompt, as in code editing or quoting: a snippet ``X`` of held-out
  code, the target's own greedy continuation ``Y`` of it, a blank line, then ``X`` again;
- ``mixed``: ``bench_engine.py``'s mixed workload (prompts cut anywhere, no planted repetition).

Per cell: tokens/s and the ratio to ``none`` (with ``--rounds N`` the median of the per-round ratios, their range,
and from 5 rounds a distribution-free 90% interval of that median; a goal is called met or not met only where the
interval lies on one side of its target), the decode-speed ratio, the mean accepted length, the acceptance rate
and the adaptive policy's measured costs at the cell's batch bucket. ``--drive sliced`` (the default) runs every
engine over a round's requests at once on this thread, in turns of ``--slice-ms`` of CPU time
(``bench/harness/sliced.py``, turns in a balanced Latin square's order) and counts tokens per second of each
engine's own CPU time, so a slow spell of the shared machine hits every engine alike; ``--drive turns`` lets
started engines take turns every ``--chunk`` requests on wall time. ``none-again``, a second engine without
speculation, is the A/A control: its ratio is the measurement's own noise. ``ngram/probe_budget=0`` (any adaptive
method, any ``AdaptiveConfig`` field) runs the policy with constants changed, for ablations. Writes
bench/results/spec.json and spec.png.

    python -m bench.bench_spec --levels 1,8,32 --rounds 15 --requests 16 --methods none,none-again,ngram,ngram-fixed
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from backend.config import EngineConfig
from backend.core.buckets import bucket
from backend.engine.llm_engine import LLMEngine, output_token_ids
from backend.spec_decode.adaptive import AdaptiveConfig, AdaptiveDraftLength
from bench.harness.closed_loop import run_engine_level
from bench.harness.report import git_commit, machine, write_json
from bench.harness.sliced import run_sliced
from bench.harness.spec_matrix import (GOALS, cell_line, combine, goal_analysis, goal_verdicts, interval_text,
                                       paired_rows, prefill_share, rounded, turn_orders)
from bench.harness.stats import summarize
from bench.harness.stream_draws import StreamDraws
from bench.harness.workload import corpus_ids, mixed_workload
from contracts.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
METHODS = {  # name -> EngineConfig overrides
    "none": {},
    # a second engine without speculation (not in the default methods): its ratio to `none` is the measurement's
    # own noise, the yardstick for the others' (an A/A test)
    "none-again": {},
    # without speculation, each sampled row's uniform the next of its sequence's own generator stream
    # (bench/harness/stream_draws.py): the keyed draw's speed baseline (sampled TPOT, docs/sampling.md)
    "none-stream-draw": {},
    "ngram": {"speculative_method": "ngram"},
    "ngram-fixed": {"speculative_method": "ngram", "speculative_adaptive": False},
    "draft": {"speculative_method": "draft"},
    "draft-fixed": {"speculative_method": "draft", "speculative_adaptive": False},
    # standard rejection sampling with the draft's q instead of the Gumbel coupling (docs/sampling.md): their
    # sampled acceptance side by side
    "draft-rejection": {"speculative_method": "draft", "draft_coupling": "rejection"},
    "draft-fixed-rejection": {"speculative_method": "draft", "speculative_adaptive": False,
                              "draft_coupling": "rejection"},
}

OPTIONAL_METHODS = ("none-again", "none-stream-draw", "draft-rejection", "draft-fixed-rejection")   # not by default


def method_spec(name: str) -> tuple[dict, dict]:
    """``(EngineConfig overrides, AdaptiveConfig overrides)`` of a method: one of ``METHODS``, or an adaptive one
    with some of its policy's constants changed, ``ngram/probe_budget=0/skip_idle=false`` (an ablation)."""
    base, *changes = name.split("/")
    if base not in METHODS or (changes and not METHODS[base].get("speculative_adaptive", True)) or \
            (changes and base.startswith("none")):
        raise ValueError(f"--methods: unknown method {name!r} (of {', '.join(METHODS)}, an adaptive one with "
                         "/field=value changes)")
    fields = {f.name: f.type for f in dataclasses.fields(AdaptiveConfig)}
    policy = {}
    for change in changes:
        key, _, value = change.partition("=")
        if key not in fields:
            raise ValueError(f"--methods: {key!r} is not an AdaptiveConfig field (of {', '.join(fields)})")
        kind = {"bool": lambda v: v.lower() in ("1", "true", "on"), "int": int, "float": float}[fields[key]]
        policy[key] = kind(value)
    return METHODS[base], policy


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
    """Some item samples (temperature > 0)."""
    return any(it.params.temperature > 0 for it in items)


def measured_row(engine: LLMEngine, before: tuple, records, seconds: float, sampled: bool,
                 own_seconds: bool = False) -> dict:
    """A measurement's row: tokens/s, TPOT, steps, drafts, acceptance and the adaptive policy's measured costs
    (``sampled``: the items sample; kept for the caller's record). ``own_seconds``: the seconds are the engine's
    own CPU time (a sliced run), so they are its loop's CPU time too."""
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
    policy = engine.speculator.policy if engine.speculator is not None else None
    if isinstance(policy, AdaptiveDraftLength):
        plain, extra = policy.costs.snapshot()
        row["plain_step_ms"] = {b: 1e3 * v for b, v in plain.items()}
        row["extra_ms_per_seq"] = {b: {k: 1e3 * v for k, v in by_k.items()} for b, by_k in extra.items()}
    return row


def request_chunks(items: list[Item], size: int) -> list[list[Item]]:
    """``items`` in consecutive chunks of ``size`` (the last one possibly shorter)."""
    return [items[i:i + size] for i in range(0, len(items), size)]


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
    ap.add_argument("--methods", default=",".join(m for m in METHODS if m not in OPTIONAL_METHODS),
                    help="of " + ", ".join(METHODS) + " (none-again: a second engine without speculation, the A/A "
                         "control)")
    ap.add_argument("--k", type=int, default=8, help="num_speculative_tokens (shipped: 8)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fast-decode", choices=("on", "off"), default="on", help="llm.fast_decode (shipped: on)")
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
    # It is built first: the first engine a process builds runs slower than identical ones built after it
    writer = LLMEngine(EngineConfig.from_settings(model_path=args.model, device="cpu",
                                                  fast_decode=args.fast_decode == "on")).start()
    engines = {}
    for m in args.methods.split(","):
        overrides, policy = method_spec(m)
        cfg = dict(model_path=args.model, device="cpu", cpu_threads=args.threads, kv_cache_bytes=256 << 20,
                   num_speculative_tokens=args.k, fast_decode=args.fast_decode == "on", **overrides)
        if "draft" in m:
            cfg["draft_model_path"] = args.draft
        engines[m] = LLMEngine(EngineConfig.from_settings(**cfg))
        if policy:
            engines[m].speculator.policy = AdaptiveDraftLength(args.k, AdaptiveConfig(**policy))
        if m == "none-stream-draw":
            engines[m].runner.sampler.draws = StreamDraws()
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
                    for m, r in paired_rows(runs, one_thread=args.threads == 1).items():
                        r.update(method=m, workload=wl, temperature=temp, concurrency=c)
                        cells.append(r)
                        print(cell_line(r, bucket(c)), flush=True)
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
            fixed = at1.get(f"{method}-fixed")      # its acceptance, with the adaptive engine's measured costs
            found = goal_analysis(at1[method], fixed, args.k, goal, prefill)
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
