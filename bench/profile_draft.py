"""Where a draft-model proposal's time goes, per draft token: the draft's forward (eager or native),
the sampling of ``q`` (filters, softmax, draw) and the rest (Python bookkeeping, block reservation).

Runs the demo pair with a fixed ``k`` and the fast target step, at batch 1 and 8, greedy and T=0.8, and
prints, per cell, the proposal time per draft token split into those parts, next to the target's
measured step time. Timers wrap the proposer's own calls, so the split is exact up to the timers' cost.

    .venv/bin/python bench/profile_draft.py [--draft-native on|off] [--levels 1,8] [--tokens 48]
"""
from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tokenizers import Tokenizer

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.spec_decode import draft_model
from bench.workload import mixed_workload
from contracts.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]


class Timers:
    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def span(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def wrap(self, owner, attr: str, name: str) -> None:
        fn = getattr(owner, attr)

        def timed(*a, **kw):
            with self.span(name):
                return fn(*a, **kw)
        setattr(owner, attr, timed)


def instrument(engine: LLMEngine, timers: Timers) -> None:
    prop = engine.speculator.proposer
    timers.wrap(prop, "propose", "propose")
    logits = prop.forward.logits

    def timed_logits(rows, starts, news, ids):
        with timers.span("forward"), timers.span("catch_up" if len(ids) > len(rows) else "one_token"):
            return logits(rows, starts, news, ids)
    prop.forward.logits = timed_logits
    timers.wrap(prop.sampler, "build_batch", "sampling")
    timers.wrap(draft_model, "compute_probs", "sampling")
    timers.wrap(draft_model, "inverse_cdf_draw", "sampling")
    timers.wrap(engine.runner, "execute", "target_step")


def run_cell(engine: LLMEngine, prompts, level: int, temperature: float, tokens: int) -> dict:
    timers = Timers()
    instrument(engine, timers)
    spec0 = engine.scheduler.spec_counters.num_draft_tokens
    steps0 = engine.stats().steps
    for i in range(0, len(prompts), level):
        batch = prompts[i:i + level]
        params = [SamplingParams(max_tokens=tokens, temperature=temperature, ignore_eos=True,
                                 seed=7 + j if temperature else None) for j in range(len(batch))]
        engine.generate(batch, params)
    drafts = engine.scheduler.spec_counters.num_draft_tokens - spec0
    steps = engine.stats().steps - steps0
    s = timers.seconds
    prop, fwd, samp = s.get("propose", 0.0), s.get("forward", 0.0), s.get("sampling", 0.0)
    return {"drafts": drafts, "steps": steps, "propose_us_per_draft": 1e6 * prop / max(drafts, 1),
            "forward_us_per_draft": 1e6 * fwd / max(drafts, 1), "sampling_us_per_draft": 1e6 * samp / max(drafts, 1),
            "python_us_per_draft": 1e6 * (prop - fwd - samp) / max(drafts, 1),
            "catch_up_us_per_draft": 1e6 * s.get("catch_up", 0.0) / max(drafts, 1),
            "one_token_us_per_draft": 1e6 * s.get("one_token", 0.0) / max(drafts, 1),
            "target_step_ms": 1e3 * s.get("target_step", 0.0) / max(steps, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models/demo-target"))
    ap.add_argument("--draft", default=str(ROOT / "models/demo-draft"))
    ap.add_argument("--levels", default="1,8")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--draft-native", choices=("on", "off"), default="on",
                    help="the draft's steps through the native op (EngineConfig.fast_decode drives both)")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    prompts = [r.prompt_ids for r in mixed_workload(tok, args.requests, seed=5, prompt_range=(32, 256))]
    engine = LLMEngine(EngineConfig(model_path=args.model, speculative_method="draft", draft_model_path=args.draft,
                                    num_speculative_tokens=args.k, speculative_adaptive=False, fast_decode=True,
                                    cpu_threads=1, device="cpu")).start()
    fwd = engine.speculator.proposer.forward
    if args.draft_native == "off":
        fwd.native, fwd.native_reason = None, "off (--draft-native off)"
    print(f"draft steps: {'native' if fwd.native is not None else 'eager ' + fwd.native_reason}")
    engine.generate(prompts[:2], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))   # warm up
    try:
        for level in [int(v) for v in args.levels.split(",")]:
            for temp in (0.0, 0.8):
                r = run_cell(engine, prompts, level, temp, args.tokens)
                print(f"batch {level} T={temp}: {r['drafts']} drafts in {r['steps']} steps; per draft token: "
                      f"propose {r['propose_us_per_draft']:.0f} us = forward {r['forward_us_per_draft']:.0f} + "
                      f"sampling {r['sampling_us_per_draft']:.0f} + python {r['python_us_per_draft']:.0f} "
                      f"(forward: catch-up {r['catch_up_us_per_draft']:.0f}, one-token steps "
                      f"{r['one_token_us_per_draft']:.0f}); "
                      f"target step {r['target_step_ms']:.2f} ms")
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
