"""Draft-model speculation's step costs, measured in one run with the draft's steps native and eager.

Runs the demo pair with the fast target step (``fast_decode``) and a fixed ``k`` on the mixed workload,
greedy and T=0.8, at the given batch sizes; first with the draft's steps through the native op, then
(same process, same requests) eagerly. Per cell it prints:

- the draft proposal per draft token, split into the draft's forwards (catch-up, one-token steps), the
  sampling of ``q`` (filters, softmax, draw) and the rest (Python bookkeeping, block reservation);
- medians of whole engine steps: a plain decode step (run with ``speculative_method=none`` on the same
  requests), and a verify step with ``k`` drafts per sequence split into its target side (schedule,
  verify forward, rejection, update) and the proposal of the next drafts;
- per-position acceptance ``a`` (from the mean accepted length), the speed-up those costs predict,
  ``(1 + a + ... + a^k) * plain / (verify + propose)``, and the ``a`` that would reach 1.3x at these costs.

Timers wrap the engine's own calls (thread CPU time is not used: the step's wall time is what a client
sees). Machine noise: run it quiet, under the exclusive CPU lock, and read ratios within one run.

    .venv/bin/python tools/profile/profile_draft.py [--levels 1,8] [--k 4] [--tokens 64] [--requests 8]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from tokenizers import Tokenizer

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.spec_decode import draft_model
from bench.harness.workload import mixed_workload
from contracts.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[2]
GOAL = 1.3


class Timers:
    """Summed seconds per name, and per-step samples per step kind."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.samples: dict[str, list[float]] = {}

    @contextmanager
    def span(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def sample(self, kind: str, seconds: float) -> None:
        self.samples.setdefault(kind, []).append(seconds)

    def median_ms(self, kind: str) -> float | None:
        xs = self.samples.get(kind)
        return 1e3 * statistics.median(xs) if xs else None


def step_kind(plan) -> str:
    """``plain`` (every sequence decodes one token), ``verify<k>`` (every sequence verifies ``k`` drafts) or
    ``other`` (prefill chunks, mixed draft lengths)."""
    if not plan.scheduled or any(s.seq.num_computed_tokens != s.seq.num_tokens - 1 for s in plan.scheduled):
        return "other"
    ks = {s.num_draft_tokens for s in plan.scheduled}
    if len(ks) != 1:
        return "other"
    k = ks.pop()
    return "plain" if k == 0 else f"verify{k}"


class Patches:
    """Attribute replacements, undone together."""

    def __init__(self):
        self._undo: list[tuple[object, str, object]] = []

    def set(self, owner, attr: str, value) -> None:
        self._undo.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    def timed(self, timers: Timers, owner, attr: str, name: str) -> None:
        fn = getattr(owner, attr)

        def timed(*a, **kw):
            with timers.span(name):
                return fn(*a, **kw)
        self.set(owner, attr, timed)

    def undo(self) -> None:
        for owner, attr, value in reversed(self._undo):
            setattr(owner, attr, value)
        self._undo = []


def instrument(engine: LLMEngine, timers: Timers, patches: Patches) -> None:
    """Times engine steps by kind (the proposal inside a step counted apart) and the proposer's parts."""
    kind = ["other"]
    schedule, step = engine.scheduler.schedule, engine.step

    def scheduling():
        plan = schedule()
        kind[0] = step_kind(plan)
        return plan

    def timed_step():
        kind[0] = "other"
        before = timers.seconds.get("propose", 0.0)
        t0 = time.perf_counter()
        step()
        total = time.perf_counter() - t0
        proposed = timers.seconds.get("propose", 0.0) - before
        timers.sample(kind[0], total - proposed)
        if proposed:
            timers.sample(f"propose_after_{kind[0]}", proposed)
    patches.set(engine.scheduler, "schedule", scheduling)
    patches.set(engine, "step", timed_step)
    if engine.speculator is None:
        return
    prop = engine.speculator.proposer
    patches.timed(timers, prop, "propose", "propose")
    logits = prop.forward.logits

    def timed_logits(rows, starts, news, ids):
        with timers.span("forward"), timers.span("catch_up" if len(ids) > len(rows) else "one_token"):
            return logits(rows, starts, news, ids)
    patches.set(prop.forward, "logits", timed_logits)
    patches.timed(timers, prop.sampler, "build_batch", "sampling")
    patches.timed(timers, draft_model, "compute_probs", "sampling")
    patches.timed(timers, draft_model, "inverse_cdf_draw", "sampling")


def run_cell(engine: LLMEngine, prompts, level: int, temperature: float, tokens: int
             ) -> tuple[Timers, int, tuple[int, int]]:
    """Timers, draft tokens, and (accepted drafts, verifications) of the prompts run ``level`` at a time."""
    timers, patches = Timers(), Patches()
    instrument(engine, timers, patches)
    spec = engine.scheduler.spec_counters
    drafts0, accepted0, verifies0 = spec.num_draft_tokens, spec.num_accepted_tokens, spec.num_drafts
    try:
        for i in range(0, len(prompts), level):
            batch = prompts[i:i + level]
            params = [SamplingParams(max_tokens=tokens, temperature=temperature, ignore_eos=True,
                                     seed=7 + i + j if temperature else None) for j in range(len(batch))]
            engine.generate(batch, params)
    finally:
        patches.undo()
    return timers, spec.num_draft_tokens - drafts0, (spec.num_accepted_tokens - accepted0,
                                                      spec.num_drafts - verifies0)


def geometric(a: float, k: int) -> float:
    """``1 + a + ... + a^k``: tokens per verify step with per-position acceptance ``a``."""
    return sum(a ** i for i in range(k + 1))


def solve_acceptance(k: int, target: float) -> float | None:
    """The ``a`` in [0, 1] with ``geometric(a, k) = target`` (None: out of reach)."""
    if geometric(1.0, k) < target:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if geometric(mid, k) < target else (lo, mid)
    return hi


def report(label: str, timers: Timers, drafts: int, acc: tuple[int, int], plain_ms: float | None, k: int) -> None:
    s, n = timers.seconds, max(drafts, 1)
    us = {name: 1e6 * s.get(name, 0.0) / n for name in ("propose", "forward", "sampling", "catch_up", "one_token")}
    print(f"  {label}: {drafts} drafts; per draft token: propose {us['propose']:.0f} us = forward {us['forward']:.0f} "
          f"(catch-up {us['catch_up']:.0f}, one-token {us['one_token']:.0f}) + sampling {us['sampling']:.0f} + rest "
          f"{us['propose'] - us['forward'] - us['sampling']:.0f}")
    verify, propose = timers.median_ms(f"verify{k}"), timers.median_ms(f"propose_after_verify{k}")
    accepted, verifies = acc
    if verify is None or propose is None or not verifies or plain_ms is None:
        print("    (no steady verify steps measured)")
        return
    mean_len = 1 + accepted / verifies
    a = solve_acceptance(k, mean_len) or 1.0
    cost = verify + propose
    print(f"    median steps: plain {plain_ms:.3f} ms; verify k={k}: target side {verify:.3f} ms + proposal "
          f"{propose:.3f} ms = {cost / plain_ms:.2f} plain steps; accepted length {mean_len:.2f} (a = {a:.2f}); "
          f"predicted {mean_len * plain_ms / cost:.2f}x of none; 1.3x needs a >= "
          + (f"{need:.2f}" if (need := solve_acceptance(k, GOAL * cost / plain_ms)) is not None else "(out of reach)")
          + f", or at a = {a:.2f} a verify + proposal <= {mean_len / GOAL:.2f} plain steps")


def op_costs(step, max_tokens: int, position: int = 200) -> list[float]:
    """Best-of-5 microseconds of the native op alone at 1..max_tokens tokens of one sequence (a verify step
    of ``T - 1`` drafts at batch 1), ``step`` a ``NativeDecodeStep`` over the target or the draft."""
    table = torch.arange(-(-(position + max_tokens) // step.block_size), dtype=torch.int32)[None]   # [1, width]
    out = []
    for n in range(1, max_tokens + 1):
        ids, rows = torch.full((n,), 5, dtype=torch.int64), torch.zeros(n, dtype=torch.int32)
        pos = torch.arange(position, position + n)
        for _ in range(20):
            step.forward(ids, pos, rows, table)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(40):
                step.forward(ids, pos, rows, table)
            best = min(best, (time.perf_counter() - t0) / 40)
        out.append(1e6 * best)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models/demo-target"))
    ap.add_argument("--draft", default=str(ROOT / "models/demo-draft"))
    ap.add_argument("--levels", default="1,8")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--temperatures", default="0,0.8")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    prompts = [r.prompt_ids for r in mixed_workload(tok, args.requests, seed=5, prompt_range=(32, 256))]
    common = {"model_path": args.model, "fast_decode": True, "cpu_threads": 1, "device": "cpu"}
    none = LLMEngine(EngineConfig(**common)).start()
    spec = LLMEngine(EngineConfig(**common, speculative_method="draft", draft_model_path=args.draft,
                                  num_speculative_tokens=args.k, speculative_adaptive=False)).start()
    fwd = spec.speculator.proposer.forward
    native = fwd.native
    print(f"draft steps: {'native' if native is not None else 'eager ' + fwd.native_reason}; k = {args.k}")
    try:
        for engine in (none, spec):
            engine.generate(prompts[:2], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))   # warm up
        target, draft = none.runner.fast_decode, native
        if target is not None and draft is not None:
            t_us, d_us = op_costs(target, args.k + 1), op_costs(draft, 2)
            print("native op alone, one sequence at context 200: target " + ", ".join(
                f"T={n + 1} {u:.0f} us ({u / t_us[0]:.2f}x)" for n, u in enumerate(t_us))
                + f"; draft T=1 {d_us[0]:.0f} us ({d_us[0] / t_us[0]:.2f} of the target's), T=2 {d_us[1]:.0f} us")
        for level in [int(v) for v in args.levels.split(",")]:
            for temp in [float(v) for v in args.temperatures.split(",")]:
                plain, _, _ = run_cell(none, prompts, level, temp, args.tokens)
                print(f"batch {level}, T={temp}:")
                for label, step in (("native", native), ("eager", None)):
                    if label == "native" and native is None:
                        continue
                    fwd.native = step
                    timers, drafts, acc = run_cell(spec, prompts, level, temp, args.tokens)
                    report(f"draft {label}", timers, drafts, acc, plain.median_ms("plain"), args.k)
                fwd.native = native
    finally:
        none.shutdown()
        spec.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
