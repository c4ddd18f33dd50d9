"""backend/serving/decode_gaps.py: one inter-token gap per decode step, measured on a real engine."""
from __future__ import annotations

import pytest

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.serving.decode_gaps import DecodeGaps
from backend.serving.metrics import ITL_FAMILY, EngineMetrics
from backend.serving.request_metrics import TOKEN_LATENCY_BUCKETS
from contracts.sampling_params import SamplingParams
from tests.helpers.triton_fakes import make_pb_utils


def engine_with_gaps(checkpoint, **kw) -> tuple[LLMEngine, DecodeGaps]:
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(checkpoint), kv_cache_bytes=8 << 20,
                                                  max_model_len=256, **kw))
    gaps = DecodeGaps()
    engine.observers.observers.append(gaps)
    return engine, gaps


def test_one_gap_per_decode_step_summing_to_the_decode_time(tiny_checkpoint):
    engine, gaps = engine_with_gaps(tiny_checkpoint)
    try:
        out, = engine.generate([[3, 4, 5, 6]], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
        stats = out[-1].stats
        recorded = gaps.drain()
        assert len(recorded) == stats.num_decode_steps == 5 and all(g > 0 for g in recorded)
        assert sum(recorded) == pytest.approx(sum(stats.inter_token_latencies))   # the timeline's per-token gaps
        assert gaps.drain() == []                                          # taken once
    finally:
        engine.shutdown()


def test_a_step_decoding_several_sequences_is_one_gap(tiny_checkpoint):
    engine, gaps = engine_with_gaps(tiny_checkpoint)
    try:
        outs = engine.generate([[3, 4, 5, 6], [7, 8, 9, 10]], SamplingParams(max_tokens=6, temperature=0.0,
                                                                            ignore_eos=True))
        steps = {o[-1].stats.num_decode_steps for o in outs}
        assert steps == {5}                                    # both sequences decode in the same 5 steps
        assert len(gaps.drain()) == 5                          # 5 observations, not 10
    finally:
        engine.shutdown()


def test_a_full_buffer_drops_and_counts():
    class Seq:
        def __init__(self):
            self.timeline = type("T", (), {"last_token": 1.0})()

    class Scheduled:
        def __init__(self, seq):
            self.seq = seq

    gaps, seq = DecodeGaps(max_pending=2), Seq()
    plan = type("Plan", (), {"scheduled": [Scheduled(seq)]})()
    for i in range(4):
        gaps.before(plan)
        seq.timeline.last_token += 0.5
        gaps.sampled(plan, None)
    assert gaps.drain() == [0.5, 0.5] and gaps.dropped == 2
    with pytest.raises(ValueError, match="max_pending"):
        DecodeGaps(max_pending=0)


def test_engine_metrics_observe_the_drained_gaps_as_one_histogram():
    pb = make_pb_utils()
    pending = [[0.02, 0.03], [], [0.5]]
    stats = type("S", (), dict(kv_blocks_max=1, kv_blocks_used=0, kv_blocks_free=1, kv_blocks_reused=0,
                               tokens_per_block=16, num_running=0, num_waiting=0, num_prefilling=0,
                               num_scheduled=0, num_preemptions=0, prefix_cache_queries=0, prefix_cache_hits=0,
                               steps=0, loop=None, spec=type("C", (), dict(num_drafts=0, num_draft_tokens=0,
                                                                           num_accepted_tokens=0,
                                                                           num_standby_steps=0,
                                                                           accepted_per_pos=[]))()))()
    m = EngineMetrics(pb, lambda: stats, max_num_seqs=4, decode_gaps=lambda: pending.pop(0))
    for _ in range(3):
        m.update()
    fam, = [f for f in pb.families if f.name == ITL_FAMILY]
    metric, = fam.metrics
    assert fam.kind == "histogram" and metric.buckets == TOKEN_LATENCY_BUCKETS
    assert metric.observations == [0.02, 0.03, 0.5]
