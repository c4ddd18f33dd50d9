"""The draft model's steps through the native decode op (``fast_decode``): the same drafts and the same
``q`` as the eager draft, round after round of simulated verification (rollback, multi-token catch-ups,
a prompt longer than the op's first token buffers), every draft block back at the end; drafts the op cannot
serve stay eager and say why; an engine speculating with native draft steps is lossless and leaks
nothing when requests stop, abort or get preempted in the middle of speculation."""
from __future__ import annotations

import random

import pytest
import torch

from backend.config import EngineConfig
from backend.core.sequence import Sequence
from backend.engine.llm_engine import LLMEngine, output_token_ids
from backend.engine.native_decode import NativeDecodeStep
from backend.model.config import ModelConfig
from backend.spec_decode.draft_model import DraftModelProposer
from contracts.sampling_params import SamplingParams
from tests.helpers.checkpoints import DEMO_DRAFT, make_random_checkpoint

VOCAB = 4096


def load_proposer(target, draft, fast: bool, coupling: str = "gumbel", dtype=torch.float32) -> DraftModelProposer:
    config = EngineConfig.from_settings(model_path=str(target), speculative_method="draft", draft_model_path=str(draft),
                                        fast_decode=fast, device="cpu", draft_coupling=coupling)
    return DraftModelProposer.load(draft, target, ModelConfig.from_file(target / "config.json"), config,
                                   num_blocks=128, device=torch.device("cpu"), dtype=dtype,
                                   max_model_len=512, native_step=NativeDecodeStep.build if fast else None)


def counting_native_calls(proposer: DraftModelProposer) -> list[int]:
    """Counts the native op's calls (one entry per call: its number of tokens)."""
    calls, forward = [], proposer.forward.native.forward

    def counted(token_ids, *args):
        calls.append(token_ids.shape[0])
        return forward(token_ids, *args)
    proposer.forward.native.forward = counted
    return calls


@pytest.fixture(scope="module", params=[(64, 4, 2), (48, 2, 1)], ids=["head_dim16", "head_dim24"])
def draft_checkpoint(request, tmp_path_factory):
    hidden, heads, kv_heads = request.param
    return make_random_checkpoint(tmp_path_factory.mktemp("draft") / "ckpt", layers=2, hidden=hidden, heads=heads,
                                  kv_heads=kv_heads, intermediate=96, seed=11)


@pytest.mark.parametrize("temperature,coupling", [(0.0, "gumbel"), (0.9, "gumbel"), (0.9, "rejection")])
def test_native_draft_steps_equal_the_eager_ones(draft_checkpoint, temperature, coupling):
    rng = random.Random(5)
    native, eager = (load_proposer(draft_checkpoint, draft_checkpoint, fast, coupling) for fast in (True, False))
    assert native.forward.native is not None, native.forward.native_reason
    assert eager.forward.native is None
    calls = counting_native_calls(native)
    lengths = [3, 17, 40, 94, 9]    # 163 prompt tokens in the first call: past the buffers and the per-token limit
    seqs = [Sequence(seq_id=i, request_id=str(i), seq_index=0, prompt_token_ids=[rng.randrange(VOCAB) for _ in
                     range(n)], params=SamplingParams(max_tokens=400, temperature=temperature, top_k=50 * (i % 2),
                                                      seed=100 + i if i % 3 else None))
            for i, n in enumerate(lengths)]
    compared = 0
    for round_ in range(12):
        ks = [rng.randint(0 if round_ else 1, 4) for _ in seqs]
        a, b = native.propose(seqs, ks), eager.propose(seqs, ks)
        assert a.draft_token_ids == b.draft_token_ids
        assert a.draft_probs.keys() == b.draft_probs.keys()
        for seq_id, q in a.draft_probs.items():
            assert q.shape == b.draft_probs[seq_id].shape
            torch.testing.assert_close(q, b.draft_probs[seq_id], rtol=1e-4, atol=1e-6)
            compared += q.shape[0]
        for seq in seqs:           # verification: accept some drafts, then a recovered or bonus token
            drafts = a.draft_token_ids.get(seq.seq_id, [])
            accepted = drafts[:rng.randint(0, len(drafts))]
            extra = [rng.randrange(VOCAB) for _ in range(1 if rng.random() < 0.8 else rng.randint(2, 12))]
            seq.output_token_ids.extend(accepted + extra)     # sometimes several tokens the draft never saw
    assert sum(len(d) for d in a.draft_token_ids.values()) > 0
    assert (compared > 0) == (temperature > 0 and coupling == "rejection")   # coupled drafts need no q
    assert calls and max(calls) > len(seqs), "no multi-token catch-up went through the native op"
    if native.forward.native.prefills:   # a tiled head dim: the prompts' catch-up too (else it runs eagerly)
        assert calls[0] == sum(lengths), "the prompts' catch-up did not go through the native op"
    else:
        assert calls[0] < sum(lengths)
    for p in (native, eager):
        p.free([s.seq_id for s in seqs])
        assert p.num_used_blocks == 0


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_catch_up_leaves_the_drafts_unchanged_and_takes_the_prompt_out_of_the_timed_proposal(draft_checkpoint,
                                                                                            temperature):
    """``catch_up`` (untimed by the speculator) feeds a new sequence's prompt, or the tokens it missed while
    not drafting; the proposal after it feeds only the last few known tokens, and its drafts and ``q`` equal
    those of a proposer that caught up inside ``propose``."""
    rng = random.Random(3)
    early, late = (load_proposer(draft_checkpoint, draft_checkpoint, fast=True) for _ in range(2))
    calls = counting_native_calls(early)
    seqs = [Sequence(seq_id=i, request_id=str(i), seq_index=0, prompt_token_ids=[rng.randrange(VOCAB) for _ in
                     range(n)], params=SamplingParams(max_tokens=400, temperature=temperature, seed=7 + i))
            for i, n in enumerate([20, 12, 25])]
    for round_ in range(6):
        ks = [4, 2, 3]
        calls.clear()
        early.catch_up(seqs, ks)
        caught = list(calls)
        calls.clear()
        a, b = early.propose(seqs, ks), late.propose(seqs, ks)
        assert a.draft_token_ids == b.draft_token_ids
        for seq_id, q in a.draft_probs.items():
            torch.testing.assert_close(q, b.draft_probs[seq_id], rtol=1e-4, atol=1e-6)
        assert calls[0] <= 2 * len(seqs)                   # timed: the recovered/bonus token, an accepted draft
        if round_ in (0, 3):                               # new sequences, then 20 tokens missed: caught up first
            assert caught == [3 * 20 if round_ else 19 + 11 + 24]     # all but the last known token, one call
        else:
            assert not caught                              # a few tokens behind: left to the proposal
        for seq in seqs:
            drafts = a.draft_token_ids[seq.seq_id]
            missed = 20 if round_ == 2 else 0              # e.g. steps at k = 0
            seq.output_token_ids.extend(drafts[:1] + [rng.randrange(VOCAB) for _ in range(1 + missed)])
    for p in (early, late):
        p.free([s.seq_id for s in seqs])
        assert p.num_used_blocks == 0


FILTERS = [  # sampled requests: filters that ignore the output (q's batch is built once per proposal) and some
    # that depend on it (penalties, min_tokens holding back stop ids, bad words: rebuilt at every draft position)
    {"temperature": 0.9, "top_k": 40, "seed": 1}, {"temperature": 0.7, "top_p": 0.9, "min_p": 0.02},
    {"temperature": 1.0, "repetition_penalty": 1.3, "seed": 2}, {"temperature": 0.8, "presence_penalty": 0.5,
                                                                 "frequency_penalty": 0.3},
    {"temperature": 0.9, "min_tokens": 7, "stop_token_ids": (5, 6, 7), "seed": 3},
    {"temperature": 0.6, "bad_words_ids": ((11, 12), (13,))}, {"temperature": 0.0},
]


def test_q_is_the_drafts_distribution_under_each_requests_filters(draft_checkpoint):
    """Each sampled draft's ``q`` equals the draft model's distribution at that position recomputed densely
    (no KV cache), under the request's filters with the drafts before it as output."""
    from backend.sampling.processing import compute_probs
    from tests.helpers.oracle import dense_logits

    rng = random.Random(8)
    proposer = load_proposer(draft_checkpoint, draft_checkpoint, fast=True, coupling="rejection")
    seqs = [Sequence(seq_id=i, request_id=str(i), seq_index=0, prompt_token_ids=[rng.randrange(VOCAB) for _ in
                     range(rng.randint(4, 30))], params=SamplingParams(max_tokens=100, **kw))
            for i, kw in enumerate(FILTERS)]
    checked = 0
    for _ in range(3):
        out = proposer.propose(seqs, [4] * len(seqs))
        for seq in seqs:
            drafts, q = out.draft_token_ids[seq.seq_id], out.draft_probs.get(seq.seq_id)
            assert (q is None) == (seq.params.temperature == 0.0)
            for j in range(len(drafts) if q is not None else 0):
                with torch.inference_mode():
                    logits = dense_logits(proposer.model, seq.all_token_ids + drafts[:j])[-1:]
                batch = proposer.sampler.build_batch([seq], output_token_ids=[seq.output_token_ids + drafts[:j]])
                torch.testing.assert_close(q[j], compute_probs(logits, batch)[0], rtol=1e-4, atol=1e-6)
                assert q[j][drafts[j]] > 0
                checked += 1
            seq.output_token_ids.extend(drafts[:1] + [rng.randrange(VOCAB)])
    assert checked == 3 * 4 * (len(FILTERS) - 1)
    proposer.free([s.seq_id for s in seqs])
    assert proposer.num_used_blocks == 0


def test_a_draft_the_op_cannot_serve_stays_eager(tiny_checkpoint, tmp_path):
    """A sliding-window draft runs natively (the op honours windows); in bfloat16 (the op computes in float32) the
    same draft drafts eagerly."""
    draft = make_random_checkpoint(tmp_path / "mistral", layers=1, hidden=32, heads=2, kv_heads=1, intermediate=64,
                                   extra={"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                                          "sliding_window": 16})
    assert load_proposer(tiny_checkpoint, draft, fast=True).forward.native is not None
    proposer = load_proposer(tiny_checkpoint, draft, fast=True, dtype=torch.bfloat16)
    assert proposer.forward.native is None and "float32" in proposer.forward.native_reason
    seq = Sequence(seq_id=0, request_id="0", seq_index=0, prompt_token_ids=list(range(5, 40)),
                   params=SamplingParams(max_tokens=10, temperature=0.0))
    assert len(proposer.propose([seq], [3]).draft_token_ids[0]) == 3
    proposer.free([0])
    assert proposer.num_used_blocks == 0


def blocks_in_use(engine: LLMEngine) -> tuple[int, int]:
    return engine.stats().kv_blocks_used, engine.speculator.proposer.num_used_blocks


@pytest.mark.parametrize("variant", ["plain", "preemption"])
def test_engine_with_native_draft_steps_is_lossless_and_returns_every_block(demo_target, variant):
    """Greedy output with native draft steps equals the engine's output without speculation; requests
    cut by max_tokens and by a stop token inside accepted runs, sampled ones alongside."""
    kw = {"model_path": str(demo_target), "kv_cache_bytes": 32 << 20, "device": "cpu", "max_num_seqs": 16,
          "fast_decode": True}
    if variant == "preemption":
        kw.update(num_kv_blocks=16, block_size=16, watermark=0.0, max_model_len=256)
    rng = random.Random(9)
    prompts = [[0] + [rng.randrange(3, VOCAB) for _ in range(rng.randint(8, 60))] for _ in range(8)]
    params = [SamplingParams(max_tokens=rng.randint(5, 30), temperature=0.0, ignore_eos=True) for _ in prompts]
    ref = LLMEngine(EngineConfig.from_settings(**kw))
    try:
        expected = [output_token_ids(o) for o in ref.generate(prompts, params)]
    finally:
        ref.shutdown()
    stop = expected[0][len(expected[0]) // 2]
    params[0] = SamplingParams(max_tokens=params[0].max_tokens, temperature=0.0, ignore_eos=True,
                               stop_token_ids=(stop,))
    expected[0] = expected[0][:expected[0].index(stop) + 1]
    sampled = [SamplingParams(max_tokens=20, temperature=0.8, seed=i, ignore_eos=True) for i in range(3)]
    engine = LLMEngine(EngineConfig.from_settings(**kw, speculative_method="draft", draft_model_path=str(DEMO_DRAFT),
                                                  num_speculative_tokens=4, speculative_adaptive=False))
    assert engine.speculator.proposer.forward.native is not None
    calls = counting_native_calls(engine.speculator.proposer)
    try:
        outs = engine.generate(prompts + prompts[:3], params + sampled)
        assert [output_token_ids(o) for o in outs[:len(prompts)]] == expected
        assert all(len(output_token_ids(o)) == 20 for o in outs[len(prompts):])
        spec = engine.scheduler.spec_counters
        assert spec.num_draft_tokens > 0 and spec.num_accepted_tokens > 0 and calls
        if variant == "preemption":
            assert engine.stats().num_preemptions > 0
        assert blocks_in_use(engine) == (0, 0)
    finally:
        engine.shutdown()
