"""The speculator's step costs come on the loop thread's CPU clock for CPU steps on one thread, wall time
otherwise (backend/spec_decode/step_costs.py), and the proposer is timed on the same clock."""
from __future__ import annotations

import time

import pytest

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from contracts.sampling_params import SamplingParams
from tests.helpers.oracle import repeating_prompts


@pytest.mark.parametrize("cpu_threads", [1, 2])
def test_step_seconds_and_clock_follow_the_threads_of_the_step(tiny_checkpoint, cpu_threads):
    engine = LLMEngine(EngineConfig(model_path=str(tiny_checkpoint), device="cpu", kv_cache_bytes=16 << 20,
                                    speculative_method="ngram", cpu_threads=cpu_threads))
    spec = engine.speculator
    seen = []
    after_step = spec.after_step

    def record(scheduler, plan, output, seconds, clock=time.perf_counter):
        threads = engine.threads._current if engine.threads.active else 1
        seen.append((threads, seconds, clock))
        return after_step(scheduler, plan, output, seconds, clock)

    spec.after_step = record
    engine.generate(repeating_prompts(1, 3, stem_len=8, span_range=(4, 8), gap_range=(0, 4)),
                    SamplingParams(max_tokens=12, temperature=0.0))
    assert seen
    for threads, seconds, clock in seen:
        assert seconds > 0
        assert clock is (time.thread_time if threads == 1 else time.perf_counter)
    if cpu_threads == 2:
        assert {threads for threads, _, _ in seen} == {1, 2}     # the policy tries both: both clocks seen
