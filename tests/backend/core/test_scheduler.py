"""Scheduler: token budget, admission, chunked prefill, preemption, forks, stops, streaming, abort.

The fake runner stands in for the model: a token's "K/V" is a rolling hash of its prefix,
written to its paged slot and read back through the block table, and the "sampled" token is
a function of that K/V. A wrong block table, a stale prefix-cache hit, a missed
copy-on-write or a lost token after preemption therefore changes the outputs or trips an
assert, and any correct schedule (whatever the pool, budget or preemptions) yields the same
tokens as a roomy reference run.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.config import EngineConfig
from backend.core.outputs import FinishReason, TokenLogprob
from backend.core.plan import ModelRunnerOutput
from backend.core.scheduler import Scheduler, SchedulerOutput
from backend.core.sequence import SequenceStatus
from backend.core.stream_pacer import StreamPacer
from contracts.sampling_params import SamplingParams

VOCAB, EOS = 64, 1
MASK = (1 << 61) - 1


def kv_value(prev: int, token: int, pos: int) -> int:
    return hash((prev, token, pos)) & MASK


SAMPLE_SALT = 0x5A3D   # ints only: hash() of a str is salted per process, so a failure would not replay


def next_token(kv: int, seq_index: int) -> int:
    return hash((kv, seq_index, SAMPLE_SALT)) % VOCAB


class FakeRunner:
    def __init__(self, scheduler: Scheduler):
        self.sch = scheduler
        self.bs = scheduler.config.cache.block_size
        self.slots: dict[int, int] = {}          # slot (block * bs + offset) -> kv value

    def _slot(self, seq, pos: int) -> int:
        return seq.block_table[pos // self.bs] * self.bs + pos % self.bs

    def execute(self, plan: SchedulerOutput) -> ModelRunnerOutput:
        bm = self.sch.block_manager
        for src, dst in plan.blocks_to_copy:     # copy-on-write before the forward
            for o in range(self.bs):
                if src * self.bs + o in self.slots:
                    self.slots[dst * self.bs + o] = self.slots[src * self.bs + o]
                else:
                    self.slots.pop(dst * self.bs + o, None)
        sampled, logprobs = [], []
        for s in plan.scheduled:
            seq = s.seq
            assert seq.status is SequenceStatus.RUNNING
            assert s.num_draft_tokens == len(seq.draft_token_ids)
            tokens = seq.all_token_ids + seq.draft_token_ids
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + s.num_new_tokens
            assert end <= len(tokens) and len(seq.block_table) * self.bs >= end
            assert s.sample == (end >= seq.num_tokens)
            prev = self.slots[self._slot(seq, start - 1)] if start else 0
            vals = []
            for p in range(start, end):
                block = bm.blocks[seq.block_table[p // self.bs]]
                assert block.ref_count == 1 and block.block_hash is None, "write into a shared or cached block"
                prev = kv_value(prev, tokens[p], p)
                self.slots[self._slot(seq, p)] = prev
                vals.append(prev)
            # the whole context read back through the block table must be this sequence's
            expect = 0
            for p in range(end):
                expect = kv_value(expect, tokens[p], p)
                assert self.slots[self._slot(seq, p)] == expect, f"seq {seq.seq_id}: wrong K/V at position {p}"
            if not s.sample:
                sampled.append([])
                logprobs.append(None)
                continue
            # verify: targets after the last known token and after each draft
            first = seq.num_tokens - 1 - start
            out = []
            for j in range(first, len(vals)):
                t = next_token(vals[j], seq.seq_index)
                out.append(t)
                draft_idx = j - first
                if draft_idx >= s.num_draft_tokens or seq.draft_token_ids[draft_idx] != t:
                    break
            sampled.append(out)
            logprobs.append([TokenLogprob(t, -0.5) for t in out])
        return ModelRunnerOutput(sampled, logprobs)


def propose_drafts(sch: Scheduler, k: int, rng_seed: int) -> None:
    """Speculative proposer: the true continuation, corrupted at a pseudo-random position."""
    proposals = {}
    for seq in sch.running:
        if seq.num_tokens - seq.num_computed_tokens != 1:
            continue
        tokens = seq.all_token_ids
        kv = 0
        for p, t in enumerate(tokens):
            kv = kv_value(kv, t, p)
        drafts = []
        for j in range(k):
            t = next_token(kv, seq.seq_index)
            if hash((rng_seed, seq.seq_id, len(tokens), j)) % 4 == 0:
                t = (t + 1) % VOCAB                   # a wrong guess
            drafts.append(t)
            kv = kv_value(kv, t, len(tokens) + j)
        proposals[seq.seq_id] = drafts
    sch.update_draft_token_ids(proposals)


@dataclass
class Run:
    tokens: dict = field(default_factory=dict)          # (rid, seq_index) -> streamed tokens
    reasons: dict = field(default_factory=dict)         # (rid, seq_index) -> FinishReason
    final: dict = field(default_factory=dict)           # rid -> number of request_finished outputs
    admit_order: list = field(default_factory=list)     # rids in first-admission order
    steps: int = 0
    preemptions: int = 0
    copies: int = 0


def make_scheduler(num_blocks=64, block_size=4, max_model_len=64, **cfg) -> Scheduler:
    return Scheduler(EngineConfig.from_settings(model_path="m", block_size=block_size, **cfg), num_blocks=num_blocks,
                     max_model_len=max_model_len, vocab_size=VOCAB, eos_token_ids=[EOS], cache_key="test")


def run(sch: Scheduler, requests, spec_k: int = 0, aborts: dict | None = None, max_steps: int = 5000,
        runner: FakeRunner | None = None) -> Run:
    """Add ``requests`` [(rid, prompt, params, arrival_step)], step to completion, check invariants."""
    runner, res, cfg = runner or FakeRunner(sch), Run(), sch.config
    pending = sorted(requests, key=lambda r: r[3])
    seen = set()
    aborts = dict(aborts or {})

    def collect(outs):
        for o in outs:
            key = (o.request_id, o.seq_index)
            assert not res.reasons.get(key), f"output after the final one for {key}"
            res.tokens.setdefault(key, []).extend(o.new_token_ids)
            if o.finished:
                res.reasons[key] = o.finish_reason
            if o.request_finished:
                res.final[o.request_id] = res.final.get(o.request_id, 0) + 1

    while pending or sch.has_unfinished():
        assert res.steps < max_steps, "no progress"
        while pending and pending[0][3] <= res.steps:
            rid, prompt, params, _ = pending.pop(0)
            sch.add_request(rid, prompt, params)
        for rid in [r for r, at in aborts.items() if at <= res.steps]:
            del aborts[rid]
            used = sch.block_manager.num_used_blocks
            outs = sch.abort(rid)
            if outs:
                assert outs[-1].request_finished and outs[-1].finish_reason is FinishReason.ABORT
                assert all(o.finished for o in outs)
                assert sch.block_manager.num_used_blocks <= used
                assert rid not in sch.request_ids()
            collect(outs)
        if spec_k:
            propose_drafts(sch, spec_k, res.steps)
        plan = sch.schedule()
        res.steps += 1
        res.preemptions += len(plan.preempted)
        res.copies += len(plan.blocks_to_copy)
        # invariants of the plan
        limits = cfg.scheduler
        assert plan.num_batched_tokens == sum(s.num_new_tokens for s in plan.scheduled) <= limits.max_num_batched_tokens
        assert len(plan.scheduled) <= limits.max_num_seqs and len(sch.running) <= limits.max_num_seqs
        assert len({id(s.seq) for s in plan.scheduled}) == len(plan.scheduled)
        assert all(s.num_new_tokens >= 1 for s in plan.scheduled)
        if sch.has_unfinished():
            assert plan.scheduled, "idle step with work left"
        for s in plan.scheduled:
            if s.seq.seq_index == 0 and s.seq.request_id not in seen and s.seq.num_preemptions == 0:
                seen.add(s.seq.request_id)
                res.admit_order.append(s.seq.request_id)
        live = [s for s in sch.running] + list(sch.waiting)
        refs: dict[int, int] = {}
        for s in live:
            for b in s.block_table:
                refs[b] = refs.get(b, 0) + 1
        assert all(not s.block_table for s in sch.waiting)
        assert all(b.ref_count == refs.get(b.block_id, 0) for b in sch.block_manager.blocks)
        collect(sch.update_from_output(plan, runner.execute(plan)))
    assert sch.block_manager.num_used_blocks == 0
    assert sch.block_manager.num_free_blocks == sch.block_manager.num_blocks
    assert not sch.running and not sch.waiting
    return res


# ---- deterministic scenarios --------------------------------------------------------------------

def greedy(**kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, **kw)


def test_chunked_prefill_samples_only_at_the_end():
    sch = make_scheduler(max_num_batched_tokens=8)
    sch.add_request("a", list(range(2, 22)), greedy(max_tokens=3, ignore_eos=True))    # 20 tokens
    plans = []
    for _ in range(3):
        plan = sch.schedule()
        plans.append([(s.num_new_tokens, s.sample) for s in plan.scheduled])
        sch.update_from_output(plan, ModelRunnerOutput([[5] if s.sample else [] for s in plan.scheduled]))
    assert plans == [[(8, False)], [(8, False)], [(4, True)]]
    assert sch.running[0].output_token_ids == [5] and sch.running[0].num_computed_tokens == 20


def test_decode_first_then_admission_within_the_budget():
    sch = make_scheduler(max_num_batched_tokens=10)
    sch.add_request("a", [3] * 6, greedy(max_tokens=5, ignore_eos=True))
    plan = sch.schedule()
    sch.update_from_output(plan, ModelRunnerOutput([[7]]))
    sch.add_request("b", [4] * 30, greedy(max_tokens=5, ignore_eos=True))
    plan = sch.schedule()
    assert [(s.seq.request_id, s.num_new_tokens, s.sample) for s in plan.scheduled] == [("a", 1, True), ("b", 9, False)]
    assert plan.num_batched_tokens == 10


def test_max_num_seqs_and_fcfs():
    sch = make_scheduler(max_num_seqs=2, max_num_batched_tokens=100)
    reqs = [(f"r{i}", [2 + i] * 5, greedy(max_tokens=4, ignore_eos=True), 0) for i in range(5)]
    res = run(sch, reqs)
    assert res.admit_order == [f"r{i}" for i in range(5)]
    assert all(len(res.tokens[(f"r{i}", 0)]) == 4 for i in range(5))


def test_admission_is_fcfs_even_when_a_later_request_would_fit():
    sch = make_scheduler(num_blocks=16, max_num_batched_tokens=256, watermark=0.0)
    sch.add_request("big1", [3] * 40, greedy(max_tokens=8, ignore_eos=True))      # 10 blocks
    sch.add_request("big2", [4] * 40, greedy(max_tokens=8, ignore_eos=True))      # 10 blocks: does not fit
    sch.add_request("small", [5] * 3, greedy(max_tokens=2, ignore_eos=True))      # 1 block: would fit
    plan = sch.schedule()
    assert [s.seq.request_id for s in plan.scheduled] == ["big1"]
    assert [s.request_id for s in sch.waiting] == ["big2", "small"]
    runner = FakeRunner(sch)
    sch.update_from_output(plan, runner.execute(plan))
    res = run(sch, [], runner=runner)
    assert set(res.final) == {"big1", "big2", "small"}


def test_drafts_are_trimmed_to_budget_context_and_max_tokens():
    sch = make_scheduler(max_num_batched_tokens=64, max_model_len=24)
    sch.add_request("a", [3] * 10, greedy(max_tokens=4, ignore_eos=True))
    sch.add_request("b", [4] * 10, greedy(max_tokens=14, ignore_eos=True))
    plan = sch.schedule()
    sch.update_from_output(plan, ModelRunnerOutput([[7], [7]]))
    a, b = sch.running
    sch.update_draft_token_ids({a.seq_id: [7] * 5, b.seq_id: [7] * 5})
    plan = sch.schedule()
    # a: 1 output, may add 3 more -> at most 2 drafts; b: 11 tokens of 24 -> room for 5 drafts + 1
    assert [(s.num_new_tokens, s.num_draft_tokens) for s in plan.scheduled] == [(3, 2), (6, 5)]
    assert a.draft_token_ids == [7, 7]
    sch.update_from_output(plan, ModelRunnerOutput([[7, 7, 7], [7, 8]]))        # a: all accepted, b: 1 of 5
    assert a.is_finished and a.finish_reason is FinishReason.LENGTH and a.num_output_tokens == 4
    assert b.num_computed_tokens == 12 and b.num_tokens == 13 and b.draft_token_ids == []
    sch.update_draft_token_ids({b.seq_id: [7] * 12})
    plan = sch.schedule()       # 13 tokens, 3 outputs of 14: at most 10 more drafts
    assert [(s.num_new_tokens, s.num_draft_tokens) for s in plan.scheduled] == [(11, 10)]
    tight = make_scheduler(max_num_batched_tokens=3)
    tight.add_request("c", [3] * 4, greedy(max_tokens=10, ignore_eos=True))
    while not tight.running or tight.running[0].num_output_tokens == 0:   # 4-token prompt in chunks of 3
        plan = tight.schedule()
        tight.update_from_output(plan, ModelRunnerOutput([[7] if s.sample else [] for s in plan.scheduled]))
    tight.update_draft_token_ids({tight.running[0].seq_id: [7] * 5})
    assert [(s.num_new_tokens, s.num_draft_tokens) for s in tight.schedule().scheduled] == [(3, 2)]   # budget


def test_tiny_pool_preempts_and_outputs_match_an_unpreempted_run():
    reqs = [(f"r{i}", [(7 * i + j) % 60 + 2 for j in range(10 + i)], greedy(max_tokens=20, ignore_eos=True), 0)
            for i in range(4)]
    ref = run(make_scheduler(num_blocks=200, max_num_batched_tokens=256), reqs)
    tiny = make_scheduler(num_blocks=16, max_model_len=64, max_num_batched_tokens=256, watermark=0.0)
    res = run(tiny, reqs)
    assert ref.preemptions == 0 and res.preemptions > 0 and tiny.num_preemptions == res.preemptions
    assert res.tokens == ref.tokens and res.reasons == ref.reasons
    assert all(len(t) == 20 for t in res.tokens.values())


def test_preempted_sequence_goes_to_the_front_of_the_queue():
    sch = make_scheduler(num_blocks=16, watermark=0.0)
    for rid in ("a", "b"):
        sch.add_request(rid, [3 if rid == "a" else 4] * 28, greedy(max_tokens=20, ignore_eos=True))   # 7 blocks each
    sch.add_request("c", [9] * 12, greedy(max_tokens=4, ignore_eos=True))                   # 3 blocks: waits
    runner, preempted = FakeRunner(sch), []
    for _ in range(6):
        plan = sch.schedule()
        preempted += plan.preempted
        if plan.preempted:
            break
        sch.update_from_output(plan, runner.execute(plan))
    assert [s.request_id for s in preempted] == ["b"]            # the most recently admitted
    assert [s.request_id for s in sch.waiting] == ["b", "c"]      # ahead of the never-admitted one
    b = preempted[0]
    assert b.block_table == [] and b.num_output_tokens == 5 and b.num_preemptions == 1   # 1 at prefill + 4 decodes
    assert [s.seq.request_id for s in plan.scheduled] == ["a"]


def test_parallel_samples_fork_share_blocks_and_copy_on_write():
    sch = make_scheduler(num_blocks=64)
    seqs = sch.add_request("r", list(range(2, 12)), SamplingParams(n=3, max_tokens=6, ignore_eos=True))
    plan = sch.schedule()
    assert [s.seq.seq_index for s in plan.scheduled] == [0]           # only seq 0 prefills
    runner = FakeRunner(sch)
    sch.update_from_output(plan, runner.execute(plan))
    assert [s.seq_index for s in sch.running] == [0, 1, 2]
    assert seqs[1].block_table == seqs[0].block_table and sch.block_manager.num_used_blocks == 3
    plan = sch.schedule()
    assert [(s.seq.seq_index, s.num_new_tokens) for s in plan.scheduled] == [(0, 1), (1, 1), (2, 1)]
    assert len(plan.blocks_to_copy) == 2                               # 3 holders of the partial block
    sch.update_from_output(plan, runner.execute(plan))
    assert seqs[0].block_table[:2] == seqs[1].block_table[:2] == seqs[2].block_table[:2]
    res = run(sch, [], runner=runner)
    assert res.final == {"r": 1} and res.copies == 0
    ref = run(make_scheduler(num_blocks=64, block_size=1, enable_prefix_caching=False),
              [("r", list(range(2, 12)), SamplingParams(n=3, max_tokens=6, ignore_eos=True), 0)])
    assert [s.output_token_ids for s in seqs] == [ref.tokens[("r", i)] for i in range(3)]
    assert len({tuple(ref.tokens[("r", i)]) for i in range(3)}) == 3  # different samples per index


def test_stop_conditions():
    # the fake model's continuation of this prompt, then stops placed on it
    ref = run(make_scheduler(), [("x", [5, 6, 7], greedy(max_tokens=12, ignore_eos=True), 0)]).tokens[("x", 0)]
    t = ref[3]
    stop = run(make_scheduler(), [("x", [5, 6, 7], greedy(max_tokens=12, stop_token_ids=(t,), ignore_eos=True), 0)])
    k = ref.index(t)
    assert stop.tokens[("x", 0)] == ref[:k + 1] and stop.reasons[("x", 0)] is FinishReason.STOP
    later = run(make_scheduler(), [("x", [5, 6, 7], greedy(max_tokens=12, stop_token_ids=(t,), min_tokens=k + 2,
                                                           ignore_eos=True), 0)])
    assert len(later.tokens[("x", 0)]) >= k + 2          # min_tokens holds the stop back
    assert later.tokens[("x", 0)] == ref[:len(later.tokens[("x", 0)])]
    length = run(make_scheduler(), [("x", [5, 6, 7], greedy(max_tokens=4, ignore_eos=True), 0)])
    assert length.tokens[("x", 0)] == ref[:4] and length.reasons[("x", 0)] is FinishReason.LENGTH


def test_eos_stops_unless_ignored_or_before_min_tokens():
    sch = make_scheduler()
    sch.add_request("e", [3, 4], greedy(max_tokens=8, min_tokens=2))
    sch.add_request("i", [3, 4], greedy(max_tokens=3, ignore_eos=True))
    outs = []
    for _ in range(4):
        plan = sch.schedule()
        outs += sch.update_from_output(plan, ModelRunnerOutput([[EOS] for _ in plan.scheduled]))
    e_final = [o for o in outs if o.request_id == "e" and o.finished]
    i_final = [o for o in outs if o.request_id == "i" and o.finished]
    assert e_final[0].num_output_tokens == 2 and e_final[0].finish_reason is FinishReason.STOP
    assert i_final[0].num_output_tokens == 3 and i_final[0].finish_reason is FinishReason.LENGTH
    assert not sch.has_unfinished() and sch.block_manager.num_used_blocks == 0


def test_stream_interval_buffers_and_flushes_on_finish():
    sch = make_scheduler(stream_interval=3)
    sch.add_request("s", [3, 4, 5], greedy(max_tokens=8, ignore_eos=True, logprobs=0))
    outs = []
    while sch.has_unfinished():
        plan = sch.schedule()
        outs += sch.update_from_output(plan, ModelRunnerOutput([[9]], [[TokenLogprob(9, -1.0)]]))
    assert [len(o.new_token_ids) for o in outs] == [1, 3, 3, 1]         # first at once, then every 3, rest at end
    assert [len(o.logprobs) for o in outs] == [1, 3, 3, 1]
    assert outs[-1].request_finished and outs[-1].cum_logprob == pytest.approx(-8.0)
    assert sum(o.request_finished for o in outs) == 1


def test_the_pacer_given_at_construction_sets_the_interval_of_each_step():
    pacer = StreamPacer(3, 0.0)
    sch = Scheduler(EngineConfig.from_settings(model_path="m", block_size=4), num_blocks=64, max_model_len=64,
                    vocab_size=VOCAB,
                    eos_token_ids=[EOS], pacer=pacer)
    sch.add_request("s", [3, 4, 5], greedy(max_tokens=9, ignore_eos=True))
    sizes = []
    for step in range(9):
        pacer.current = 1 if step >= 4 else 3            # what the engine's pacer chose for this step
        sizes += [len(o.new_token_ids) for o in sch.update_from_output(sch.schedule(), ModelRunnerOutput([[9]]))]
    assert sizes == [1, 3, 1, 1, 1, 1, 1]                # first at once, then 3 held, then every token


def test_can_admit_given_at_construction_holds_only_the_sequences_it_refuses():
    held = {"g"}
    sch = Scheduler(EngineConfig.from_settings(model_path="m", block_size=4), num_blocks=64, max_model_len=64,
                    vocab_size=VOCAB,
                    eos_token_ids=[EOS], can_admit=lambda seq: seq.request_id not in held)
    sch.add_request("g", [3, 4], greedy(max_tokens=2))
    sch.add_request("p", [5, 6], greedy(max_tokens=2))
    assert [s.seq.request_id for s in sch.schedule().scheduled] == ["p"]
    held.clear()
    assert [s.seq.request_id for s in sch.schedule().scheduled] == ["p", "g"]


def test_abort_frees_blocks_at_once_and_ends_the_stream():
    sch = make_scheduler()
    sch.add_request("a", list(range(2, 30)), SamplingParams(n=2, max_tokens=10, ignore_eos=True))
    sch.add_request("w", list(range(2, 10)), greedy(max_tokens=5, ignore_eos=True))
    runner = FakeRunner(sch)
    for _ in range(2):
        plan = sch.schedule()
        sch.update_from_output(plan, runner.execute(plan))
    assert sch.block_manager.num_used_blocks > 0
    used_by_w = len(next(s for s in sch.running if s.request_id == "w").block_table)
    outs = sch.abort("a")
    assert [(o.seq_index, o.finished, o.request_finished, o.finish_reason) for o in outs] == [
        (0, True, False, FinishReason.ABORT), (1, True, True, FinishReason.ABORT)]
    assert sch.block_manager.num_used_blocks == used_by_w
    assert sch.abort("a") == [] and sch.abort("nope") == []
    outs = sch.abort("w", reason=FinishReason.ERROR, error="boom")
    assert outs[-1].error == "boom" and outs[-1].request_finished
    assert sch.block_manager.num_used_blocks == 0 and not sch.has_unfinished()


def test_abort_of_a_waiting_request():
    sch = make_scheduler(max_num_seqs=1)
    sch.add_request("a", [2, 3], greedy(max_tokens=5))
    sch.add_request("b", [2, 3], greedy(max_tokens=5))
    sch.schedule()
    outs = sch.abort("b")
    assert len(outs) == 1 and outs[0].request_finished and not sch.waiting


def test_speculative_drafts_roll_back_and_match_plain_decoding():
    reqs = [(f"r{i}", [(3 * i + j) % 50 + 2 for j in range(6 + 3 * i)], greedy(max_tokens=15), 0) for i in range(3)]
    ref = run(make_scheduler(), reqs)
    spec = run(make_scheduler(max_num_batched_tokens=16), reqs, spec_k=3)
    assert spec.tokens == ref.tokens and spec.reasons == ref.reasons
    assert spec.steps < ref.steps                        # accepted drafts save steps


def test_request_validation():
    sch = make_scheduler(max_model_len=32, max_num_seqs=4)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        sch.add_request("a", [], greedy())
    with pytest.raises(ValueError, match="prompt_token_ids"):
        sch.add_request("a", [1] * 33, greedy())
    with pytest.raises(ValueError, match="max_tokens"):
        sch.add_request("a", [1] * 20, greedy(max_tokens=13))
    with pytest.raises(ValueError, match="prompt_token_ids"):
        sch.add_request("a", [1, VOCAB], greedy())
    with pytest.raises(ValueError, match="prompt_token_ids"):
        sch.add_request("a", [1, -1], greedy())
    with pytest.raises(ValueError, match="n:"):
        sch.add_request("a", [1], SamplingParams(n=5))
    sch.add_request("a", [1] * 20, greedy(max_tokens=12))
    with pytest.raises(ValueError, match="request_id"):
        sch.add_request("a", [1], greedy())
    assert sch.request_ids() == ["a"]


def test_pool_too_small_for_max_model_len_is_rejected():
    with pytest.raises(ValueError, match="num_kv_blocks"):
        make_scheduler(num_blocks=3, block_size=4, max_model_len=64)


# ---- random workloads ---------------------------------------------------------------------------

@st.composite
def workloads(draw, min_requests=1, min_prompt=1, min_max_tokens=1):
    bases = [draw(st.lists(st.integers(2, VOCAB - 1), min_size=12, max_size=12)) for _ in range(2)]
    reqs = []
    for i in range(draw(st.integers(min_requests, 7))):
        base = bases[draw(st.integers(0, 1))]
        prompt = base[:draw(st.integers(0, 12))] + draw(st.lists(st.integers(0, VOCAB - 1), max_size=14))
        prompt = (prompt + [2] * min_prompt)[:max(len(prompt), min_prompt)]
        max_tokens = draw(st.integers(min_max_tokens, 16))
        params = SamplingParams(max_tokens=max_tokens, min_tokens=draw(st.integers(0, max_tokens)),
                                n=draw(st.integers(1, 3)), ignore_eos=draw(st.booleans()), logprobs=0,
                                stop_token_ids=tuple(draw(st.lists(st.integers(2, VOCAB - 1), max_size=2))))
        reqs.append((f"r{i}", prompt, params, draw(st.integers(0, 6))))
    return reqs


@st.composite
def configs(draw, tiny_pool=False, min_budget=1):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    need = -(-64 // block_size)            # blocks for one max_model_len (64) sequence: the smallest pool allowed
    return dict(block_size=block_size, num_blocks=need if tiny_pool else draw(st.integers(need, 3 * need)),
                max_num_seqs=draw(st.integers(3, 6)), max_num_batched_tokens=draw(st.integers(min_budget, 48)),
                stream_interval=draw(st.integers(1, 4)), enable_prefix_caching=draw(st.booleans()),
                watermark=draw(st.sampled_from([0.0, 0.05])))


@settings(max_examples=40, deadline=None)
@given(workloads(), configs(), st.sampled_from([0, 0, 2]))
def test_random_workloads_match_the_reference_and_free_everything(reqs, cfg, spec_k):
    ref = run(make_scheduler(num_blocks=2000, max_num_batched_tokens=512, max_num_seqs=64), reqs)
    res = run(make_scheduler(**cfg), reqs, spec_k=spec_k)
    assert res.tokens == ref.tokens and res.reasons == ref.reasons
    n_seqs = sum(p.n for _, _, p, _ in reqs)
    assert len(res.reasons) == n_seqs and res.final == {rid: 1 for rid, *_ in reqs}
    # FCFS: first admissions follow arrival order (ties broken by submission order)
    arrival = {rid: (at, i) for i, (rid, _, _, at) in enumerate(reqs)}
    assert res.admit_order == sorted(res.admit_order, key=arrival.get)


@settings(max_examples=25, deadline=None)
@given(workloads(min_requests=3, min_prompt=10, min_max_tokens=8), configs(tiny_pool=True, min_budget=16),
       st.sampled_from([0, 2]))
def test_random_workloads_on_a_tiny_pool_preempt_and_still_match(reqs, cfg, spec_k):
    ref = run(make_scheduler(num_blocks=2000, max_num_batched_tokens=512, max_num_seqs=64), reqs)
    sch = make_scheduler(**cfg)
    res = run(sch, reqs, spec_k=spec_k)
    assert res.tokens == ref.tokens and res.reasons == ref.reasons
    assert res.final == {rid: 1 for rid, *_ in reqs} and sch.num_preemptions == res.preemptions


@settings(max_examples=25, deadline=None)
@given(workloads(), configs(), st.data())
def test_random_aborts_end_every_request_once_and_free_everything(reqs, cfg, data):
    aborts = {rid: data.draw(st.integers(0, 12)) for rid, *_ in reqs if data.draw(st.booleans())}
    res = run(make_scheduler(**cfg), reqs, aborts=aborts)
    assert res.final == {rid: 1 for rid, *_ in reqs}


def test_drafts_enter_only_for_running_sequences_and_inside_the_vocabulary():
    sch = make_scheduler()
    sch.add_request("a", [3] * 4, greedy(max_tokens=8, ignore_eos=True))
    (waiting,) = list(sch.waiting)
    sch.update_draft_token_ids({waiting.seq_id: [5, 6]})            # not running: dropped
    assert waiting.draft_token_ids == []
    plan = sch.schedule()
    sch.update_from_output(plan, ModelRunnerOutput([[7]]))
    for bad in (VOCAB, -1, True, 5.0, "5"):                          # outside, or not an integer id
        with pytest.raises(ValueError, match="draft_token_ids"):
            sch.update_draft_token_ids({waiting.seq_id: [5, bad]})
    sch.update_draft_token_ids({waiting.seq_id: [np.int64(5), 6]})   # any integral type, stored as int
    assert waiting.draft_token_ids == [5, 6] and all(type(t) is int for t in waiting.draft_token_ids)
