"""Where a speculative step's time goes: per-section wall time of engine steps at batch 1.

Runs requests of ``bench_spec.py``'s workloads one at a time through ``LLMEngine.step()`` on this thread
(no loop thread, so the sections add up to the step) and times the sections of every step by wrapping the
functions that make them: scheduling, the persistent batch's ``prepare``, the native forward, verification
(``ModelRunner.sample``: greedy argmax + ``greedy_verify``, or the sampler's rejection path), the scheduler's
``update_from_output`` (multi-token runs, KV truncation of rejected drafts), the speculator (policy, proposer,
draft hand-over), output emission and the rest of the loop. Prints ms per step and the share of each section,
for ``none`` and for the method given, so the verify step's cost in plain steps can be read off. The requests
alternate between the two engines (one request on each in turn), and the clock is the loop thread's CPU time
by default (``--clock cpu``: the engine runs with one thread, so time other processes take from it while it is
descheduled does not count; ``--clock wall`` for wall time).

    .venv/bin/python tools/profile/profile_spec_step.py [--method ngram] [--fixed] [--workload repeat] [--temperature 0]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

from tokenizers import Tokenizer

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from bench.bench_spec import items_for, repeat_workload
from bench.harness.workload import mixed_workload

ROOT = Path(__file__).resolve().parents[2]


class SectionTimer:
    """Accumulates wall time per named section; ``wrap`` replaces ``obj.name`` by a timed call."""

    def __init__(self, clock):
        self.clock = clock
        self.seconds: dict[str, float] = defaultdict(float)
        self._undo: list = []

    def wrap(self, obj, name: str, section: str) -> None:
        fn = getattr(obj, name)
        acc, clock = self.seconds, self.clock

        def timed(*a, **kw):
            t0 = clock()
            try:
                return fn(*a, **kw)
            finally:
                acc[section] += clock() - t0
        self._undo.append((obj, name, obj.__dict__.get(name)))
        setattr(obj, name, timed)

    def reset(self) -> None:
        self.seconds.clear()

    def restore(self) -> None:
        for obj, name, own in reversed(self._undo):   # an instance attribute goes back, a method shadow goes
            if own is None:
                delattr(obj, name)
            else:
                setattr(obj, name, own)
        self._undo = []


def instrument(engine: LLMEngine, timer: SectionTimer) -> None:
    """Wrap the step's sections (instance attributes shadow the class methods; ``restore`` removes them)."""
    runner, sched = engine.runner, engine.scheduler
    timer.wrap(sched, "schedule", "schedule")
    timer.wrap(runner, "execute", "execute (all)")
    fast = runner.fast_decode
    if fast is not None:
        timer.wrap(runner.model, "forward", "execute: eager forward (prefill)")
        timer.wrap(fast.batch, "prepare", "execute: batch.prepare")
        timer.wrap(fast, "_op", "execute: native forward")
    timer.wrap(runner, "sample", "sample / verify")
    timer.wrap(sched, "update_from_output", "update_from_output")
    timer.wrap(engine, "_dispatch", "emit (dispatch)")
    spec = engine.speculator
    if spec is not None:
        timer.wrap(spec, "after_step", "speculator (all)")
        timer.wrap(spec.proposer, "propose", "speculator: proposer")
        timer.wrap(spec.policy, "choose", "speculator: policy.choose")
        timer.wrap(sched, "update_draft_token_ids", "speculator: update_draft_token_ids")


def run_request(engine: LLMEngine, item, timer: SectionTimer) -> tuple[int, float]:
    """One request alone (batch 1) through ``engine.step()``: (steps, seconds)."""
    steps0, total = engine._steps, 0.0
    engine.add_request(f"p{time.monotonic_ns()}", item.prompt_ids, item.params, lambda out: None)
    while engine.has_work():
        t0 = timer.clock()
        engine.step()
        total += timer.clock() - t0
    return engine._steps - steps0, total


def profile(engines: dict[str, LLMEngine], timers: dict[str, SectionTimer], items) -> dict[str, dict]:
    """Each item on each engine in turn; per engine: steps, seconds, sections, speculative counts."""
    for timer in timers.values():
        timer.reset()
    for eng in engines.values():
        eng.scheduler.spec_counters.__init__()
    steps, total = dict.fromkeys(engines, 0), dict.fromkeys(engines, 0.0)
    for item in items:
        for name, eng in engines.items():
            n, t = run_request(eng, item, timers[name])
            steps[name] += n
            total[name] += t
    out = {}
    for name, eng in engines.items():
        spec = eng.scheduler.spec_counters
        out[name] = {"steps": steps[name], "total": total[name], "sections": dict(timers[name].seconds),
                     "accepted": spec.num_accepted_tokens, "drafts": spec.num_draft_tokens, "verifies": spec.num_drafts}
    return out


def report(name: str, r: dict, tokens: int) -> None:
    steps = max(r["steps"], 1)
    print(f"== {name}: {steps} steps, {tokens} tokens, {1e3 * r['total'] / steps:.3f} ms/step, "
          f"{1e3 * r['total'] / tokens:.3f} ms/token")
    if r["verifies"]:
        print(f"   verifies {r['verifies']}, accepted/draft {r['accepted']}/{r['drafts']}, "
              f"mean accepted length {1 + r['accepted'] / r['verifies']:.2f}")
    for sec, s in sorted(r["sections"].items()):
        print(f"   {sec:40s} {1e3 * s / steps:7.3f} ms/step  {100 * s / r['total']:5.1f}%")
    covered = sum(s for sec, s in r["sections"].items() if sec in TOP)
    print(f"   {'(rest of the loop)':40s} {1e3 * (r['total'] - covered) / steps:7.3f} ms/step")


TOP = {"schedule", "execute (all)", "sample / verify", "update_from_output", "emit (dispatch)", "speculator (all)"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models/demo-target"))
    ap.add_argument("--method", default="ngram", choices=("ngram", "draft"))
    ap.add_argument("--fixed", action="store_true", help="speculative_adaptive=False")
    ap.add_argument("--workload", default="repeat", choices=("repeat", "mixed"))
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--clock", default="cpu", choices=("cpu", "wall"), help="the loop thread's CPU time, or wall time")
    ap.add_argument("--cprofile", default="", help="also write a cProfile of the measured runs (both engines) here")
    args = ap.parse_args(argv)
    print(f"load before {os.getloadavg()}")
    tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    base = {"model_path": args.model, "device": "cpu", "cpu_threads": 1, "kv_cache_bytes": 256 << 20,
            "fast_decode": True}
    plain = LLMEngine(EngineConfig(**base))
    spec_cfg = dict(base, speculative_method=args.method, speculative_adaptive=not args.fixed)
    if args.method == "draft":
        spec_cfg["draft_model_path"] = str(ROOT / "models/demo-draft")
    spec = LLMEngine(EngineConfig(**spec_cfg))
    if args.workload == "repeat":   # continuations from an engine of their own (no prefix-cache head start)
        prompts = repeat_workload(tok, LLMEngine(EngineConfig(**base)), args.requests, 1, args.max_tokens)
    else:
        prompts = [r.prompt_ids for r in mixed_workload(tok, args.requests, 2, (16, 384),
                                                        (args.max_tokens, args.max_tokens))]
    items = items_for(prompts, args.max_tokens, args.temperature)
    tokens = len(items) * args.max_tokens
    engines = {"none": plain, f"{args.method}{'-fixed' if args.fixed else ''}": spec}
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    timers = {name: SectionTimer(clock) for name in engines}
    for name, eng in engines.items():
        instrument(eng, timers[name])
    profile(engines, timers, items[:2])                                        # warm-up (and policy costs)
    prof = None
    if args.cprofile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    results = profile(engines, timers, items)
    if prof is not None:
        prof.disable()
        prof.dump_stats(args.cprofile)
    for name, r in results.items():
        report(name, r, tokens)
    names = list(results)
    print(f"speed-up (tokens/s, {names[1]} / none): {results['none']['total'] / results[names[1]]['total']:.2f}x")
    eager = "execute: eager forward (prefill)"
    decode = {n: r["total"] - r["sections"].get(eager, 0.0) for n, r in results.items()}
    print(f"speed-up without the eager prefill forwards: {decode['none'] / decode[names[1]]:.2f}x")
    print(f"load after {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
