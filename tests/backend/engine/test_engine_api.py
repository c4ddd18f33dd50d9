"""Engine API behaviour: bad input, abort, exactly one final output, sampling options end to end."""
from __future__ import annotations

import math
import threading
import time

import pytest

from backend.config import EngineConfig
from backend.core.outputs import FinishReason
from backend.engine.llm_engine import LLMEngine, output_token_ids
from contracts.sampling_params import SamplingParams

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    eng = LLMEngine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), kv_cache_bytes=8 << 20,
                                               max_model_len=256)).start()
    yield eng
    eng.shutdown()


def collect(engine, rid, prompt, params):
    outs, done = [], threading.Event()

    def cb(o):
        outs.append(o)
        if o.request_finished:
            done.set()
    engine.add_request(rid, prompt, params, cb)
    return outs, done


@pytest.mark.parametrize("prompt,params,field", [
    ([], SamplingParams(max_tokens=4), "prompt_token_ids"),
    (list(range(300)), SamplingParams(max_tokens=4), "prompt_token_ids"),
    ([1, 2, 3], SamplingParams(max_tokens=254), "max_tokens"),
    ([1, 2, 10**6], SamplingParams(max_tokens=4), "prompt_token_ids"),
    ([1, -5], SamplingParams(max_tokens=4), "prompt_token_ids"),
])
def test_bad_requests_raise_naming_the_field(engine, prompt, params, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        engine.add_request("bad", prompt, params, lambda o: None)


@pytest.mark.parametrize("kwargs,field", [
    (dict(temperature=math.nan), "temperature"), (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=2.0), "top_p"), (dict(top_k=-1), "top_k"),
    (dict(min_p=1.5), "min_p"), (dict(max_tokens=0), "max_tokens"), (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(presence_penalty=math.inf), "presence_penalty"), (dict(seed=-1), "seed"), (dict(n=0), "n"),
    (dict(max_tokens=4, min_tokens=5), "min_tokens"),
])
def test_bad_sampling_values(kwargs, field):
    kwargs.setdefault("max_tokens", 4)
    with pytest.raises(ValueError, match=f"^{field}:"):
        SamplingParams(**kwargs)


def test_engine_keeps_serving_after_bad_input(engine):
    with pytest.raises(ValueError):
        engine.add_request("x", [], SamplingParams(max_tokens=2), lambda o: None)
    outs, done = collect(engine, "after-bad", [0, 5, 6], SamplingParams(max_tokens=3, **GREEDY))
    assert done.wait(60) and len(output_token_ids(outs)) == 3


def test_duplicate_request_id_is_rejected(engine):
    outs, done = collect(engine, "dup", [0, 5, 6], SamplingParams(max_tokens=20, **GREEDY))
    with pytest.raises(ValueError, match="^request_id:"):
        engine.add_request("dup", [0, 5], SamplingParams(max_tokens=2), lambda o: None)
    assert done.wait(60)


def test_abort_unknown_id_returns_false(engine):
    assert engine.abort("never-submitted") is False


def test_abort_frees_blocks_and_ends_stream_once(tiny_checkpoint):
    # a step delay (a setting for tests only) keeps the request of 200 tokens running for 0.4 s at least on any CPU
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), kv_cache_bytes=8 << 20,
                                                  max_model_len=256,
                                                  test_step_delay_s=0.002)).start()
    try:
        outs, done = collect(engine, "long", [0] + list(range(10, 60)), SamplingParams(max_tokens=200, **GREEDY))
        deadline = time.time() + 30
        while not output_token_ids(outs) and time.time() < deadline:
            time.sleep(0.005)
        assert engine.abort("long") is True
        assert done.wait(30)
        assert outs[-1].finish_reason is FinishReason.ABORT
        assert sum(o.request_finished for o in outs) == 1
        assert len(output_token_ids(outs)) < 200
        deadline = time.time() + 10
        while engine.stats().kv_blocks_used and time.time() < deadline:
            time.sleep(0.01)
        assert engine.stats().kv_blocks_used == 0
    finally:
        engine.shutdown()


def test_parallel_samples_share_prompt_and_differ(engine):
    params = SamplingParams(max_tokens=8, n=3, temperature=1.0, seed=7, ignore_eos=True)
    outs, done = collect(engine, "par", [0] + list(range(100, 140)), params)
    assert done.wait(60)
    seqs = [output_token_ids(outs, i) for i in range(3)]
    assert all(len(s) == 8 for s in seqs)
    assert len({tuple(s) for s in seqs}) > 1, "three seeded samples should not all coincide"
    assert sum(o.request_finished for o in outs) == 1
    assert engine.stats().kv_blocks_used == 0


def test_seeded_sampling_is_reproducible_across_batches(engine):
    params = SamplingParams(max_tokens=12, temperature=0.9, top_k=50, seed=1234, ignore_eos=True)
    alone = engine.generate([[0, 9, 8, 7]], params)[0]
    crowd = engine.generate([[0, 9, 8, 7], [0, 1, 2], [0, 9, 8, 7]],
                            [params, SamplingParams(max_tokens=12, temperature=1.0), params])
    assert output_token_ids(alone) == output_token_ids(crowd[0]) == output_token_ids(crowd[2])


def test_stop_token_ids_and_min_tokens(engine):
    greedy = output_token_ids(engine.generate([[0, 42, 43]], SamplingParams(max_tokens=10, **GREEDY))[0])
    stop_at = greedy[4]
    first = greedy.index(stop_at)
    outs = engine.generate([[0, 42, 43]], SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=(stop_at,)))[0]
    assert output_token_ids(outs) == greedy[:first + 1]
    assert outs[-1].finish_reason is FinishReason.STOP
    # min_tokens suppresses the stop token until reached
    outs = engine.generate([[0, 42, 43]], SamplingParams(max_tokens=10, min_tokens=10, temperature=0.0,
                                                         stop_token_ids=(stop_at,)))[0]
    toks = output_token_ids(outs)
    assert len(toks) == 10 and stop_at not in toks


def test_logprobs_are_returned(engine):
    outs = engine.generate([[0, 11, 12]], SamplingParams(max_tokens=4, logprobs=3, **GREEDY))[0]
    lps = [lp for o in outs for lp in (o.logprobs or [])]
    assert len(lps) == 4
    for lp, tok in zip(lps, output_token_ids(outs)):
        assert lp.token_id == tok and lp.logprob <= 0 and len(lp.top) == 3
        assert lp.top[0][1] >= lp.top[-1][1]
        assert lp.logprob == pytest.approx(lp.top[0][1], abs=1e-5)  # greedy picks the top token
    assert outs[-1].cum_logprob == pytest.approx(sum(lp.logprob for lp in lps), abs=1e-4)


def test_stream_interval_batches_tokens(tiny_checkpoint):
    eng = LLMEngine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), kv_cache_bytes=8 << 20,
                                               stream_interval=4))
    outs = eng.generate([[0, 5, 6]], SamplingParams(max_tokens=10, **GREEDY))[0]
    assert sum(len(o.new_token_ids) for o in outs) == 10
    assert len(outs) <= 4, [len(o.new_token_ids) for o in outs]
    eng.shutdown()


class _ExplodingRunner:
    def __init__(self, real):
        self.real, self.calls = real, 0

    def execute(self, plan):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("boom")
        return self.real.execute(plan)

    def sample(self, plan, forward, **kwargs):
        return self.real.sample(plan, forward, **kwargs)


def test_failed_step_errors_its_requests_and_the_loop_survives(tiny_checkpoint):
    eng = LLMEngine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), kv_cache_bytes=8 << 20))
    eng.runner = _ExplodingRunner(eng.runner)
    eng.start()
    try:
        outs = eng.generate([[0, 5, 6], [0, 7, 8]], SamplingParams(max_tokens=10, **GREEDY), timeout=60)
        for o in outs:
            assert o[-1].request_finished and o[-1].finish_reason is FinishReason.ERROR and "boom" in o[-1].error
        assert eng.stats().kv_blocks_used == 0
        again = eng.generate([[0, 5, 6]], SamplingParams(max_tokens=3, **GREEDY), timeout=60)[0]
        assert len(output_token_ids(again)) == 3
    finally:
        eng.shutdown()


def test_shutdown_ends_every_stream(tiny_checkpoint):
    eng = LLMEngine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), kv_cache_bytes=8 << 20)).start()
    outs, done = collect(eng, "s", [0, 1, 2], SamplingParams(max_tokens=500, **GREEDY))
    time.sleep(0.05)
    eng.shutdown()
    assert done.wait(5) and outs[-1].finish_reason in (FinishReason.ABORT, FinishReason.LENGTH)
