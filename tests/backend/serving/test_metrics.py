"""backend/serving/metrics.py: TensorRT-LLM-named gauges set from engine stats."""
from __future__ import annotations

import time
from types import SimpleNamespace

from backend.core.scheduler_stats import SpecDecodeCounters
from backend.engine.loop_clock import LoopTime
from backend.serving.metrics import (
    GENERAL_FAMILY,
    KV_FAMILY,
    LOOP_FAMILY,
    REQUEST_FAMILY,
    SPEC_PER_POS,
    SPEC_PREFIX,
    EngineMetrics,
)
from tests.helpers.triton_fakes import make_pb_utils


def stats(**kw):
    base = dict(kv_blocks_max=100, kv_blocks_used=30, kv_blocks_free=70, kv_blocks_reused=5, tokens_per_block=16,
                num_running=3, num_waiting=2, num_prefilling=1, num_scheduled=3, num_preemptions=1, prefix_cache_queries=40,
                prefix_cache_hits=10, steps=9, spec=SpecDecodeCounters(), loop=None)
    base.update(kw)
    return SimpleNamespace(**base)


def values(pb, family, label):
    fam, = [f for f in pb.families if f.name == family]
    return {m.labels[label]: m.value for m in fam.metrics}


def test_gauges_follow_engine_stats():
    pb = make_pb_utils()
    current = [stats()]
    m = EngineMetrics(pb, lambda: current[0], max_num_seqs=64, model="llm", version="1")
    m.update()
    assert values(pb, KV_FAMILY, "kv_cache_block_type") == {"max": 100, "free": 70, "used": 30, "tokens_per": 16,
                                                             "reused": 5, "fraction": 0.3}
    assert values(pb, REQUEST_FAMILY, "request_type") == {"active": 5, "scheduled": 3, "context": 1, "waiting": 2,
                                                          "max": 64}
    assert values(pb, GENERAL_FAMILY, "general_type")["num_preemptions"] == 1
    fam, = [f for f in pb.families if f.name == KV_FAMILY]
    assert all(x.labels["model"] == "llm" and x.labels["version"] == "1" for x in fam.metrics)
    assert all(f.kind == "gauge" for f in pb.families if f.name.startswith("nv_trt_llm"))
    current[0] = stats(kv_blocks_used=0, kv_blocks_free=100)
    m.update()
    assert values(pb, KV_FAMILY, "kv_cache_block_type")["used"] == 0


def test_periodic_thread_updates_and_stops():
    pb = make_pb_utils()
    current = [stats()]
    m = EngineMetrics(pb, lambda: current[0], max_num_seqs=8, interval_s=0.01).start()
    try:
        current[0] = stats(num_waiting=7)
        deadline = time.monotonic() + 2
        while values(pb, REQUEST_FAMILY, "request_type")["waiting"] != 7 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert values(pb, REQUEST_FAMILY, "request_type")["waiting"] == 7
    finally:
        m.stop()


def test_speculative_counters_add_what_the_engine_counted():
    pb = make_pb_utils()
    current = [stats()]
    m = EngineMetrics(pb, lambda: current[0], max_num_seqs=8)
    m.update()
    current[0] = stats(spec=SpecDecodeCounters(3, 10, 7, [3, 2, 2]))
    m.update()
    current[0] = stats(spec=SpecDecodeCounters(5, 14, 9, [5, 2, 2, 0], num_standby_steps=40))
    m.update()
    m.update()                                                            # nothing new: nothing added
    def total(name):
        fam, = [f for f in pb.families if f.name == SPEC_PREFIX + name]
        assert fam.kind == "counter"
        return [x.value for x in fam.metrics]
    assert total("num_drafts_total") == [5] and total("num_draft_tokens_total") == [14]
    assert total("num_accepted_tokens_total") == [9] and total("num_standby_steps_total") == [40]
    per_pos = {x.labels["position"]: x.value for x in
               [f for f in pb.families if f.name == SPEC_PER_POS][0].metrics}
    assert per_pos == {"0": 5, "1": 2, "2": 2, "3": None}


def test_loop_seconds_counters_add_what_the_loop_thread_spent():
    pb = make_pb_utils()
    current = [stats()]                                                   # no loop thread yet: nothing published
    m = EngineMetrics(pb, lambda: current[0], max_num_seqs=8)
    m.update()
    fam, = [f for f in pb.families if f.name == LOOP_FAMILY]
    assert fam.kind == "counter"
    seconds = lambda: {x.labels["state"]: x.value for x in fam.metrics}
    assert seconds() == {"busy": None, "cpu": None, "runqueue": None, "blocked": None}
    current[0] = stats(loop=LoopTime(busy_s=2.0, cpu_s=1.5, runqueue_s=0.25))
    m.update()
    assert seconds() == {"busy": 2.0, "cpu": 1.5, "runqueue": 0.25, "blocked": 0.25}
    current[0] = stats(loop=LoopTime(busy_s=3.0, cpu_s=2.0, runqueue_s=0.5))
    m.update()
    m.update()                                                            # nothing new: nothing added
    assert seconds() == {"busy": 3.0, "cpu": 2.0, "runqueue": 0.5, "blocked": 0.5}
    current[0] = stats(loop=LoopTime(busy_s=4.0, cpu_s=3.5, runqueue_s=None))   # the kernel stops saying
    m.update()
    assert seconds() == {"busy": 4.0, "cpu": 3.5, "runqueue": 0.5, "blocked": 0.5}   # blocked 0.5: not lower


def test_fraction_is_used_over_max_and_zero_for_an_empty_cache():
    pb = make_pb_utils()
    current = [stats(kv_blocks_max=200, kv_blocks_used=50)]
    m = EngineMetrics(pb, lambda: current[0], max_num_seqs=8)
    m.update()
    assert values(pb, KV_FAMILY, "kv_cache_block_type")["fraction"] == 0.25
    current[0] = stats(kv_blocks_max=0, kv_blocks_used=0)
    m.update()
    assert values(pb, KV_FAMILY, "kv_cache_block_type")["fraction"] == 0.0


def test_router_gauges_equal_the_engines_own_counts(tiny_checkpoint):
    """What the Gateway API Inference Extension's picker reads (request_type waiting|scheduled,
    kv_cache_block_type fraction|tokens_per|max), step by step, against the scheduler and block manager."""
    from backend.config import EngineConfig
    from backend.engine.llm_engine import LLMEngine
    from contracts.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), kv_cache_bytes=1 << 20,
                                                  max_model_len=128,
                                                  max_num_seqs=2, block_size=16))
    pb = make_pb_utils()
    m = EngineMetrics(pb, engine.stats, max_num_seqs=2)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    for i in range(5):
        engine.add_request(f"r{i}", list(range(3, 3 + 20 + i)), params, lambda out: None)
    seen = set()
    try:
        while engine.has_work():
            engine.step()
            m.update()
            sched, bm = engine.scheduler, engine.scheduler.block_manager
            req = values(pb, REQUEST_FAMILY, "request_type")
            kv = values(pb, KV_FAMILY, "kv_cache_block_type")
            assert req["waiting"] == len(sched.waiting)
            assert req["scheduled"] == sched.num_scheduled_last_step
            assert kv["max"] == bm.num_blocks and kv["tokens_per"] == 16
            assert kv["fraction"] == bm.num_used_blocks / bm.num_blocks
            seen.add((req["waiting"] > 0, req["scheduled"], kv["fraction"] > 0))
    finally:
        engine.shutdown()
    assert (True, 2, True) in seen                        # at some step: a queue, a full batch, blocks in use
    assert values(pb, KV_FAMILY, "kv_cache_block_type")["fraction"] == 0.0   # all finished: every block back
