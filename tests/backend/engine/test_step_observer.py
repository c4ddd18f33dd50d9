"""backend/engine/step_observer.py: what watches a step sees it at the documented points, in order."""
from __future__ import annotations

import time

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.step_observer import StepObserver, StepObservers, StepStart
from contracts.sampling_params import SamplingParams


def outputs_so_far(plan) -> int:
    return sum(s.seq.num_output_tokens for s in plan.scheduled)


class Recorder(StepObserver):
    def __init__(self, engine: LLMEngine):
        self.engine, self.calls = engine, []

    def before(self, plan):
        self.calls.append(("before", plan, None))

    def sampled(self, plan, output):   # tokens out of the sampler, not yet applied by the scheduler
        self.calls.append(("sampled", plan, (sum(map(len, output.sampled_token_ids)), outputs_so_far(plan))))

    def after(self, plan, output, start):
        assert isinstance(start, StepStart) and start.wall <= time.perf_counter()
        self.calls.append(("after", plan, (self.engine.stats().steps, outputs_so_far(plan))))

    def idle(self):
        self.calls.append(("idle", None, None))


def test_hooks_run_in_order_once_per_step(tiny_checkpoint):
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), kv_cache_bytes=8 << 20,
                                                  max_model_len=256))
    rec = Recorder(engine)
    engine.observers.observers.append(rec)
    engine.generate([[3, 4, 5, 6]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    engine.step()                                         # nothing left: the observers go idle
    kinds = [k for k, _, _ in rec.calls]
    assert kinds == ["before", "sampled", "after"] * 4 + ["idle"], kinds
    steps = [rec.calls[i:i + 3] for i in range(0, 12, 3)]
    for n, ((_, p1, _), (_, p2, (sampled, before)), (_, p3, (counted, after))) in enumerate(steps, 1):
        assert p1 is p2 is p3                             # one plan per step
        assert sampled == 1 and after == before + 1       # applied between sampled() and after()
        assert counted == n                               # after(): the step is counted
    engine.shutdown()


def test_observers_call_each_member_in_the_order_given():
    seen = []

    class Named(StepObserver):
        def __init__(self, name):
            self.name = name

        def before(self, plan):
            seen.append(self.name)

    StepObservers([Named("threads"), Named("timeline")]).before(None)
    assert seen == ["threads", "timeline"]
