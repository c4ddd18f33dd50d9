"""Per-step timestamps (backend/engine/step_timeline.py) and the stats a finished request reports
(backend/core/request_state.py).

The real scheduler runs with a stub runner (always token 7) and a fake clock that advances one
second per step, so every recorded time is an exact, known number.
"""
from __future__ import annotations

import pytest

from backend.config import EngineConfig
from backend.core.outputs import FinishReason, RequestStats
from backend.core.plan import ModelRunnerOutput
from backend.core.scheduler import Scheduler
from backend.core.request_state import request_stats
from backend.engine.step_timeline import MAX_CHUNK_RECORDS, mark_scheduled, mark_step_done
from contracts.sampling_params import SamplingParams

VOCAB, EOS, TOKEN = 64, 1, 7


def make_scheduler(budget=16, num_blocks=64, max_model_len=128, **cfg) -> Scheduler:
    return Scheduler(EngineConfig.from_settings(model_path="m", block_size=4, max_num_batched_tokens=budget, **cfg),
                     num_blocks=num_blocks, max_model_len=max_model_len, vocab_size=VOCAB, eos_token_ids=[EOS])


def drive(sch: Scheduler, start=100.0):
    """Step to completion as the engine does; step k starts at start + k and ends at start + k + 0.5.
    Returns every request's final output."""
    finals, t = {}, start
    while sch.has_unfinished():
        plan = sch.schedule()
        marks = mark_scheduled(plan, t)
        sampled = [[TOKEN] if s.sample else [] for s in plan.scheduled]
        mark_step_done(plan, marks, sampled, t, t + 0.5)
        for out in sch.update_from_output(plan, ModelRunnerOutput(sampled)):
            if out.request_finished:
                finals[out.request_id] = out
        t += 1.0
    return finals


def test_chunked_prefill_then_decode_is_recorded_step_by_step():
    sch = make_scheduler(budget=16)
    seq, = sch.add_request("a", [2] * 40, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    seq.arrival_time = 99.0
    final = drive(sch)["a"]
    tl = seq.timeline
    # 40 prompt tokens in chunks of 16, 16, 8 (steps 0-2; step 2 samples the first token), then 4 decodes
    assert tl.first_scheduled == 100.0
    assert tl.prefill_chunks == [(100.0, 100.5, 16), (101.0, 101.5, 16), (102.0, 102.5, 8)]
    assert tl.num_prefill_chunks == 3 and tl.num_decode_steps == 4
    assert list(tl.inter_token_latencies) == [1.0, 1.0, 1.0, 1.0]
    assert tl.last_token == 106.5 and tl.finished is not None
    stats = final.stats
    assert isinstance(stats, RequestStats)
    assert stats.queue_time == pytest.approx(1.0)
    assert stats.num_prompt_tokens == 40 and stats.num_output_tokens == 5
    assert stats.num_decode_steps == 4 and stats.num_prefill_chunks == 3
    assert stats.seed is None and stats.num_preemptions == 0
    # only the final output carries stats
    assert final.finish_reason is FinishReason.LENGTH


def test_request_stats_latencies():
    sch = make_scheduler()
    seq, = sch.add_request("a", [2, 3, 4], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    seq.arrival_time = 99.5
    drive(sch)
    # first token sampled at step 0 (the scheduler stamps its own clock: a real monotonic time), then 3 decodes
    seq.first_token_time = 100.5
    s = request_stats([seq])
    assert s.time_to_first_token == pytest.approx(1.0)
    assert s.decode_times == ((3.0, 4),)
    assert s.time_per_output_token == pytest.approx(1.0)
    assert s.inter_token_latencies == (1.0, 1.0, 1.0)
    assert s.e2e_latency == pytest.approx(seq.timeline.finished - 99.5)


def test_one_token_request_has_no_time_per_output_token():
    sch = make_scheduler()
    sch.add_request("a", [2, 3], SamplingParams(max_tokens=1, temperature=0.0))
    s = drive(sch)["a"].stats
    assert s.num_output_tokens == 1 and s.inter_token_latencies == () and s.time_per_output_token is None


def test_several_tokens_in_one_step_split_the_step_and_are_trimmed_at_the_stop():
    # Verified drafts bring several tokens per step: the step's gap is split evenly between them. The
    # third step's tokens [7, 9, 7] end at the stop token 9, so the latency recorded for the dropped
    # last token is trimmed.
    sch = make_scheduler()
    seq, = sch.add_request("a", [2, 3], SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=(9,)))
    t, final = 100.0, None
    while sch.has_unfinished():
        sch.update_draft_token_ids({s.seq_id: [TOKEN, TOKEN] for s in sch.running})
        plan = sch.schedule()
        marks = mark_scheduled(plan, t)
        k = plan.scheduled[0].num_draft_tokens + 1
        sampled = [[TOKEN] if k == 1 else ([TOKEN] * 3 if seq.num_output_tokens < 4 else [TOKEN, 9, TOKEN])]
        mark_step_done(plan, marks, sampled, t, t + 0.5)
        outs = sch.update_from_output(plan, ModelRunnerOutput(sampled))
        final = next((o for o in outs if o.request_finished), final)
        t += 1.0
    assert seq.output_token_ids == [TOKEN] * 5 + [9]       # 1 + 3 + 2 (the third dropped after the stop)
    s = final.stats
    assert s.inter_token_latencies == pytest.approx([1 / 3] * 5)
    assert s.num_decode_steps == 2 and s.num_output_tokens == 6


def test_parallel_samples_are_summed():
    sch = make_scheduler()
    seqs = sch.add_request("a", [2, 3, 4, 5], SamplingParams(max_tokens=3, n=3, temperature=1.0, seed=11,
                                                              ignore_eos=True))
    s = drive(sch)["a"].stats
    assert s.num_output_tokens == 9 and len(s.decode_times) == 3
    assert len(s.inter_token_latencies) == 6
    assert s.seed == 11
    assert s.finished_time == max(q.timeline.finished for q in seqs)


def test_preemption_is_recorded():
    # 8 blocks of 4 tokens: two sequences growing to 24 tokens cannot both fit, so the later one is preempted
    sch = make_scheduler(num_blocks=8, budget=64, max_model_len=32, watermark=0.0)
    a, = sch.add_request("a", [2] * 12, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    b, = sch.add_request("b", [3] * 12, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    finals = drive(sch)
    assert sch.num_preemptions > 0
    total = finals["a"].stats.num_preemptions + finals["b"].stats.num_preemptions
    assert total == sch.num_preemptions
    times = finals["a"].stats.preemption_times + finals["b"].stats.preemption_times
    assert len(times) == total
    # the recompute after a preemption is a prefill chunk again
    preempted = a if a.num_preemptions else b
    assert preempted.timeline.num_prefill_chunks >= 2


def test_abort_before_scheduling_reports_no_first_token():
    sch = make_scheduler()
    sch.add_request("a", [2, 3], SamplingParams(max_tokens=3))
    out = sch.abort("a")[-1]
    assert out.request_finished and out.stats is not None
    assert out.stats.first_scheduled_time is None and out.stats.time_to_first_token is None
    assert out.stats.queue_time is None and out.stats.time_per_output_token is None
    assert out.stats.num_output_tokens == 0


def test_chunk_records_are_bounded():
    sch = make_scheduler(budget=1, num_blocks=64)
    seq, = sch.add_request("a", [2] * (MAX_CHUNK_RECORDS + 10), SamplingParams(max_tokens=1, temperature=0.0))
    drive(sch)
    assert len(seq.timeline.prefill_chunks) == MAX_CHUNK_RECORDS
    assert seq.timeline.num_prefill_chunks == MAX_CHUNK_RECORDS + 10
