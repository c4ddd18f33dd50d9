"""Scheduler.append_forced_tokens (jump-forward): appended tokens are computed by the next plan in one
chunk with the last sampled token, stream out, and stop as sampled tokens do."""
from __future__ import annotations

from backend.config import EngineConfig
from backend.core.outputs import FinishReason
from backend.core.plan import ModelRunnerOutput
from backend.core.scheduler import Scheduler
from backend.core.sequence import SequenceStatus
from contracts.sampling_params import SamplingParams


def scheduler(**cfg):
    return Scheduler(EngineConfig.from_settings(model_path="/m", block_size=4, **cfg), num_blocks=32, max_model_len=64,
                     vocab_size=64, eos_token_ids=[1])


def test_forced_tokens_are_computed_next_step_in_one_chunk():
    sch = scheduler()
    seq, = sch.add_request("r", [0, 5, 6], SamplingParams(max_tokens=10))
    plan = sch.schedule()
    sch.update_from_output(plan, ModelRunnerOutput([[7]]))
    n, out = sch.append_forced_tokens(seq, [8, 9, 10])
    assert n == 3 and out is not None and out.new_token_ids == [8, 9, 10] and not out.finished
    plan = sch.schedule()
    s, = plan.scheduled
    assert (s.num_new_tokens, s.sample, s.num_draft_tokens) == (4, True, 0)   # 7 plus the forced 8, 9, 10
    sch.update_from_output(plan, ModelRunnerOutput([[11]]))
    assert seq.output_token_ids == [7, 8, 9, 10, 11] and seq.num_computed_tokens == 3 + 4


def test_forced_tokens_stop_at_max_tokens_and_free_the_blocks():
    sch = scheduler()
    seq, = sch.add_request("r", [0, 5, 6], SamplingParams(max_tokens=3))
    sch.update_from_output(sch.schedule(), ModelRunnerOutput([[7]]))
    n, out = sch.append_forced_tokens(seq, [8, 9, 10])
    assert n == 2 and out.finished and out.request_finished and out.finish_reason is FinishReason.LENGTH
    assert seq.status is SequenceStatus.FINISHED and sch.block_manager.num_used_blocks == 0
    assert not sch.has_unfinished() and sch.append_forced_tokens(seq, [4]) == (0, None)


def test_forced_tokens_stream_at_the_paced_interval():
    """Forced tokens go out as sampled ones do: at the interval the pacer chose for the step (here every token,
    under a stream_interval of 4), never held back to the configured maximum."""
    sch = scheduler(stream_interval=4, stream_responses_per_s=100.0)
    pacer = sch.pacer
    seq, = sch.add_request("r", [0, 5, 6], SamplingParams(max_tokens=20))
    assert pacer.observe(0.0, 1) == 1                   # no rate measured yet: every token
    sch.update_from_output(sch.schedule(), ModelRunnerOutput([[7]]))
    out, = sch.update_from_output(sch.schedule(), ModelRunnerOutput([[8]]))
    assert out.new_token_ids == [8]
    n, out = sch.append_forced_tokens(seq, [9, 10])
    assert n == 2 and out is not None and out.new_token_ids == [9, 10]
    pacer.current = 4                                   # a busy engine: 4 tokens a response
    n, out = sch.append_forced_tokens(seq, [11, 12])
    assert n == 2 and out is None                       # held back, as sampled tokens are
