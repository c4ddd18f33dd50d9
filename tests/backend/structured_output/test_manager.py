"""The engine's grammar manager: the step's bitmask rows (one per verified position, ready for
speculation), draft validation, accepting tokens; forgetting a request."""
from __future__ import annotations

import threading

import pytest
import torch

from backend.core.plan import ModelRunnerOutput, ScheduledSequence, SchedulerOutput
from backend.core.sequence import Sequence, SequenceStatus
from backend.structured_output.interface import GrammarMatcher, StructuredOutputBackend
from backend.structured_output.manager import StructuredOutputManager
from contracts.sampling_params import GuideSpec, SamplingParams
from tests.helpers.checkpoints import DEMO_TARGET
from tests.helpers.grammar_walk import allowed_token_ids

V = 4096


@pytest.fixture(scope="module")
def backend():
    from grammar import XGrammarBackend

    return XGrammarBackend.from_folder(DEMO_TARGET, V, [1])


@pytest.fixture(scope="module")
def tok(backend):
    vocab = backend.tokenizer_info.decoded_vocab
    return {v.decode(): i for i, v in enumerate(vocab) if v in (b"a", b"b", b"c", b"d", b"x")}


def make_manager(backend):
    m = StructuredOutputManager(lambda: backend, vocab_size=V)
    assert m.compiles.warm_up()
    return m


def guided_seq(seq_id, rid, guide, drafts=()):
    seq = Sequence(seq_id=seq_id, request_id=rid, seq_index=0, prompt_token_ids=[0, 5],
                   params=SamplingParams(max_tokens=8, guide=guide), status=SequenceStatus.RUNNING)
    seq.draft_token_ids = list(drafts)
    return seq


def plan_of(*seqs):
    return SchedulerOutput([ScheduledSequence(s, 1 + len(s.draft_token_ids), True, len(s.draft_token_ids))
                            for s in seqs], sum(1 + len(s.draft_token_ids) for s in seqs), [], [])


def ready(manager, rid, guide):
    manager.compiles.submit(rid, guide)
    for _ in range(200):
        assert manager.compiles.poll() == []
        if manager.compiles.is_ready(guided_seq(0, rid, guide)):
            return
        threading.Event().wait(0.01)
    raise AssertionError("compile did not finish")


def test_the_xgrammar_layer_implements_the_engine_interface(backend):
    assert isinstance(backend, StructuredOutputBackend)
    assert isinstance(backend.matcher(backend.compile("regex", "a")), GrammarMatcher)


def test_one_row_per_verified_position_and_the_state_is_kept(backend, tok):
    """Rows of one sequence: position k is masked as if the first k drafts were accepted; an invalid
    draft leaves later rows unconstrained; the matcher ends where it started."""
    so = make_manager(backend)
    guide = GuideSpec("regex", "abcd")
    ready(so, "r", guide)
    seq = guided_seq(1, "r", guide, drafts=[tok["a"], tok["b"], tok["x"]])
    plain = Sequence(seq_id=2, request_id="u", seq_index=0, prompt_token_ids=[0], params=SamplingParams(),
                     status=SequenceStatus.RUNNING)
    plan = plan_of(plain, seq)
    bitmask = so.fill_bitmask(plan, [0, 1, 1, 1, 1])                # plain row, then 4 rows of seq
    assert bitmask.shape == (5, V // 32)
    rows = [allowed_token_ids(bitmask[j], V) for j in range(5)]
    assert len(rows[0]) == V                                         # unguided: no constraint
    decoded = backend.tokenizer_info.decoded_vocab
    for j, prefix in ((1, b""), (2, b"a"), (3, b"ab")):
        assert rows[j] and all((prefix + decoded[t]).startswith(b"abcd"[:len(prefix + decoded[t])]) or t == 1
                               for t in rows[j]), j
    assert tok["c"] in rows[3] and tok["a"] not in rows[3]
    assert len(rows[4]) == V                                         # after the invalid draft 'x'
    again = so.fill_bitmask(plan_of(guided_seq(1, "r", guide)), [0])
    assert torch.equal(again[0], bitmask[1])                         # state unchanged by the drafts
    assert so.valid_draft_prefix(seq, [tok["a"], tok["b"], tok["x"], tok["d"]]) == 2


def test_accept_advances_and_reports_rejections(backend, tok):
    so = make_manager(backend)
    guide = GuideSpec("regex", "ab")
    ready(so, "r", guide)
    seq = guided_seq(1, "r", guide)
    plan = plan_of(seq)
    assert so.accept(plan, ModelRunnerOutput([[tok["a"]]])) == []
    assert allowed_token_ids(so.fill_bitmask(plan, [0])[0], V) == [tok["b"]]
    failures = so.accept(plan, ModelRunnerOutput([[tok["x"]]]))
    assert failures and failures[0][0] == "r" and failures[0][1].startswith("guided_decoding_guide: ")
    assert so.accept(plan, ModelRunnerOutput([[tok["b"], 1]])) == []      # speculative: several tokens at once
    assert so.fill_bitmask(plan, [0]) is None                        # terminated: nothing to constrain
    assert so.valid_draft_prefix(seq, [tok["x"]]) == 0                # an ended grammar admits nothing more
    so.drop("r")
    assert so.num_requests == 0 and so.valid_draft_prefix(seq, [tok["x"]]) == 1   # forgotten: unconstrained


def test_no_bitmask_without_guided_rows(backend):
    so = make_manager(backend)
    plain = Sequence(seq_id=2, request_id="u", seq_index=0, prompt_token_ids=[0], params=SamplingParams(),
                     status=SequenceStatus.RUNNING)
    assert so.fill_bitmask(plan_of(plain), [0]) is None
    assert so.accept(plan_of(plain), ModelRunnerOutput([[5]])) == []


def test_begin_fill_does_no_work_without_guided_rows_and_checks_the_rows(backend, tok):
    so = make_manager(backend)
    plain = Sequence(seq_id=2, request_id="u", seq_index=0, prompt_token_ids=[0], params=SamplingParams(),
                     status=SequenceStatus.RUNNING)
    assert so.begin_fill(plan_of(plain)).rows is None                # no guided request at all
    guide = GuideSpec("regex", "abcd")
    ready(so, "r", guide)
    assert so.begin_fill(plan_of(plain)).rows is None                # guided requests, none in this plan
    seq = guided_seq(1, "r", guide, drafts=[tok["a"]])
    for on_worker in (False, True):
        so.fill_on_worker = on_worker
        pending = so.begin_fill(plan_of(plain, seq))
        assert pending.rows == [0, 1, 1]
        bitmask = pending.result([0, 1, 1])
        assert allowed_token_ids(bitmask[2], V) == allowed_token_ids(so.fill_bitmask(plan_of(seq), [0, 0])[1], V)
        with pytest.raises(RuntimeError, match="bitmask was filled for rows"):
            so.begin_fill(plan_of(plain, seq)).result([0, 1])
    so.shutdown()
