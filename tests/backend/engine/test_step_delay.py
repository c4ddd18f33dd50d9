"""``test_step_delay_s`` (a setting for tests only, backend/config ``TEST_ONLY_PARAMETERS``): the loop sleeps
after each step, outside the step's own timing, so a request of N tokens without speculation takes at least
N - 1 delays on any CPU; an abort or a shutdown does not wait for the sleep; an aborted request's final stats
count the steps that ended while its abort waited in the inbox, and when its last step ended."""
from __future__ import annotations

import time

import pytest

from backend.config import EngineConfig
from backend.core.outputs import FinishReason
from backend.engine.llm_engine import LLMEngine, output_token_ids
from contracts.sampling_params import SamplingParams
from tests.backend.engine.test_engine_api import collect

DELAY_S = 0.05
LONG_DELAY_S = 5.0      # longer than anything below waits: an abort or a shutdown that waited for it would show
GREEDY = dict(temperature=0.0, ignore_eos=True)
PROMPT = [0] + list(range(10, 40))


def engine_with(checkpoint, delay: float) -> LLMEngine:
    return LLMEngine(EngineConfig.from_settings(model_path=str(checkpoint), kv_cache_bytes=8 << 20, max_model_len=256,
                                                test_step_delay_s=delay)).start()


def submit(engine, rid, params):
    return collect(engine, rid, PROMPT, params)


def first_token(outs, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not output_token_ids(outs):
        assert time.monotonic() < deadline, "no token"
        time.sleep(0.002)


def test_every_step_is_followed_by_the_delay_outside_the_steps_timing(tiny_checkpoint):
    engine = engine_with(tiny_checkpoint, DELAY_S)
    try:
        before = engine.stats()
        t0 = time.monotonic()
        outs, done = submit(engine, "paced", SamplingParams(max_tokens=12, **GREEDY))
        assert done.wait(60)
        elapsed = time.monotonic() - t0
        after = engine.stats()
    finally:
        engine.shutdown()
    steps = after.steps - before.steps
    assert len(output_token_ids(outs)) == 12 and steps >= 12         # no speculation: one token a step at most
    assert elapsed >= (steps - 1) * DELAY_S                           # a sleep after every step but the last
    busy = after.loop.busy_s - before.loop.busy_s
    assert busy <= elapsed - (steps - 1) * DELAY_S + 0.01, "the delay counted as step time"


def test_an_abort_and_a_shutdown_do_not_wait_for_the_delay(tiny_checkpoint):
    engine = engine_with(tiny_checkpoint, LONG_DELAY_S)
    try:
        outs, done = submit(engine, "slow", SamplingParams(max_tokens=200, **GREEDY))
        first_token(outs)             # the loop now sleeps LONG_DELAY_S after the request's first step
        t0 = time.monotonic()
        assert engine.abort("slow") is True
        assert done.wait(LONG_DELAY_S / 2), "the abort waited for the step delay"
        aborted = time.monotonic() - t0
        final = outs[-1]
        assert final.finish_reason is FinishReason.ABORT and len(output_token_ids(outs)) < 200
        assert final.stats.steps_after_abort in (0, 1)          # at most the step in flight when it arrived
        assert final.stats.last_step_time is not None and final.stats.last_step_time <= final.stats.finished_time
        assert engine.stats().kv_blocks_used == 0
        outs2, _ = submit(engine, "slow-2", SamplingParams(max_tokens=200, **GREEDY))
        first_token(outs2)
        t1 = time.monotonic()
    finally:
        engine.shutdown()
    stopped = time.monotonic() - t1
    assert stopped < LONG_DELAY_S / 2, f"shutdown took {stopped:.2f} s: it waited for the step delay"
    assert outs2[-1].request_finished and outs2[-1].finish_reason is FinishReason.ABORT
    print(f"abort applied {aborted * 1000:.1f} ms after it was posted, shutdown {stopped * 1000:.1f} ms")


def test_an_abort_lets_at_most_the_step_in_flight_run(tiny_checkpoint):
    """Counted, not timed: the abort is applied before the loop schedules again, so at most one step (the one
    running when it arrived) ends in between, however fast the steps are. A short delay keeps each request of
    200 tokens running for at least 0.4 s, so every abort finds it running."""
    engine = engine_with(tiny_checkpoint, 0.002)
    try:
        counts = []
        for i in range(5):
            outs, done = submit(engine, f"r{i}", SamplingParams(max_tokens=200, **GREEDY))
            first_token(outs)
            assert engine.abort(f"r{i}") is True
            assert done.wait(30) and outs[-1].finish_reason is FinishReason.ABORT
            counts.append(outs[-1].stats.steps_after_abort)
    finally:
        engine.shutdown()
    assert all(c in (0, 1) for c in counts), counts


@pytest.mark.parametrize("bad", [-1.0, 10.5])
def test_the_engine_refuses_a_delay_out_of_range(tiny_checkpoint, bad):
    with pytest.raises(ValueError, match="^test_step_delay_s"):
        EngineConfig.from_settings(model_path=str(tiny_checkpoint), test_step_delay_s=bad)
