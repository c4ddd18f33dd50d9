"""Constrained decoding composed with speculation (n-gram and draft model, k = 1..4, adaptive on and off).

Greedy guided output with speculation equals it without (and the HF + xgrammar oracle), sampled guided
outputs stay valid, a mixed batch survives preemption and prefix hits with every target and draft block
free afterwards, EOS inside an accepted run finishes with ``stop``, jump-forward composes. Every plan is
checked as it reaches the sampler: the drafts a guided sequence verifies are grammar-valid (a draft drawn
from ``q`` may keep exactly one invalid token at its end, which verification always rejects).
"""
from __future__ import annotations

import json
import threading

import pytest

from backend.config import EngineConfig
from backend.core.outputs import FinishReason
from backend.engine.llm_engine import LLMEngine, output_token_ids
from backend.spec_decode.proposer import Proposal, Proposer
from contracts.sampling_params import GuideSpec, SamplingParams
from grammar import check_output
from tests.backend.engine.test_engine_guided import ORACLE_GUIDES, hf_oracle  # noqa: F401 (a fixture)
from tests.helpers.checkpoints import DEMO_DRAFT
from bench.harness.guides import SCHEMAS, all_guides

EXAMPLE = 'example = {"name": "ab", "address": {"city": "x", "zip": "12345"}}\nrecord = '
PROMPTS = [EXAMPLE, "x = ", 'tags = {"tags": ["a", "b"]}\nmore = ', "def f():\n    return "]
CASES = [("ngram", 1, False), ("ngram", 2, True), ("ngram", 4, False),
         ("draft", 1, True), ("draft", 3, False), ("draft", 4, True)]


def make_engine(demo_target, method="none", k=4, adaptive=False, **kw) -> LLMEngine:
    cfg = {"model_path": str(demo_target), "kv_cache_bytes": 32 << 20, "device": "cpu", "max_num_seqs": 64,
           "speculative_method": method, "num_speculative_tokens": k, "speculative_adaptive": adaptive}
    if method == "draft":
        cfg["draft_model_path"] = str(DEMO_DRAFT)
    cfg.update(kw)
    return LLMEngine(EngineConfig.from_settings(**cfg))


@pytest.fixture(scope="module")
def tokenizer(demo_target):
    from preprocess.tokenizer import load_tokenizer

    return load_tokenizer(demo_target)


class DraftAudit:
    """Wraps the runner's ``sample``: records, for every guided sequence verifying drafts, how many it
    verifies and how many its grammar admits (checked before the sampler, with the matcher at the
    accepted state), and whether they were drawn from a draft model's distribution ``q`` (sampled requests:
    with ``q`` passed for standard rejection sampling, or coupled by the keyed noise without it)."""

    def __init__(self, engine: LLMEngine):
        self.records: list[tuple[int, int, bool]] = []
        sample, so = engine.runner.sample, engine.structured
        drafts_from_q = engine.speculator is not None and engine.speculator.proposer.method == "draft"

        def audited(plan, forward, grammar_bitmask=None, draft_probs=None):
            for s in plan.scheduled:
                if s.num_draft_tokens and s.seq.params.guide is not None:
                    drafts = s.seq.draft_token_ids[:s.num_draft_tokens]
                    self.records.append((len(drafts), so.valid_draft_prefix(s.seq, drafts),
                                         drafts_from_q and s.seq.params.temperature > 0))
            return sample(plan, forward, grammar_bitmask=grammar_bitmask, draft_probs=draft_probs)
        engine.runner.sample = audited

    def check(self) -> None:
        assert self.records, "no guided sequence verified drafts"
        for n, valid, from_q in self.records:
            assert valid == n or (from_q and valid == n - 1), (n, valid, from_q)


def blocks_in_use(engine: LLMEngine) -> tuple[int, int]:
    return engine.stats().kv_blocks_used, getattr(engine.speculator.proposer, "num_used_blocks", 0)


def guided_jobs(tokenizer):
    jobs = [(kind, text) for _, kind, text in all_guides()]
    prompts = [tokenizer.encode(PROMPTS[i % len(PROMPTS)], add_special_tokens=True) for i in range(len(jobs))]
    return jobs, prompts


@pytest.fixture(scope="module")
def plain_greedy(demo_target, tokenizer):
    """Greedy guided outputs of every shared guide without speculation."""
    jobs, prompts = guided_jobs(tokenizer)
    eng = make_engine(demo_target)
    try:
        outs = eng.generate(prompts, [SamplingParams(max_tokens=48, temperature=0.0, guide=GuideSpec(k, t))
                                      for k, t in jobs])
    finally:
        eng.shutdown()
    return [output_token_ids(o) for o in outs]


@pytest.mark.parametrize("method, k, adaptive", CASES)
def test_greedy_guided_output_is_the_same_with_speculation(demo_target, tokenizer, plain_greedy, method, k, adaptive):
    jobs, prompts = guided_jobs(tokenizer)
    eng = make_engine(demo_target, method, k, adaptive)
    audit = DraftAudit(eng)
    try:
        outs = eng.generate(prompts, [SamplingParams(max_tokens=48, temperature=0.0, guide=GuideSpec(kind, text))
                                      for kind, text in jobs])
        for (kind, text), got, expected in zip(jobs, outs, plain_greedy):
            assert got[-1].error is None, got[-1].error
            assert output_token_ids(got) == expected, (kind, text[:40])
        spec = eng.scheduler.spec_counters
        assert spec.num_draft_tokens > 0 and spec.num_accepted_tokens > 0
        assert max(r[0] for r in audit.records) <= k
        audit.check()
        if method == "ngram":       # the draft model drafts under the grammar's mask: its drafts rarely need a cut
            assert eng.speculator.num_cut_draft_tokens > 0, "no proposal needed a cut: the check went untested"
        assert blocks_in_use(eng) == (0, 0)
    finally:
        eng.shutdown()


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_the_bitmask_filled_on_a_worker_thread_during_the_forward(demo_target, tokenizer, plain_greedy, method):
    """The CUDA default (the fill on a worker thread while the forward runs), forced on the CPU: the same output."""
    jobs, prompts = guided_jobs(tokenizer)
    eng = make_engine(demo_target, method, 3)
    eng.structured.fill_on_worker = True
    threads = set()
    fill = eng.structured.fill_bitmask

    def recording(plan, rows):
        threads.add(threading.current_thread().name)
        return fill(plan, rows)
    eng.structured.fill_bitmask = recording
    try:
        outs = eng.generate(prompts, [SamplingParams(max_tokens=48, temperature=0.0, guide=GuideSpec(kind, text))
                                      for kind, text in jobs])
        assert [output_token_ids(o) for o in outs] == plain_greedy
        assert threads == {"grammar-bitmask-0"}
        assert eng.scheduler.spec_counters.num_accepted_tokens > 0 and blocks_in_use(eng) == (0, 0)
    finally:
        eng.shutdown()


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_greedy_with_speculation_equals_hf_with_xgrammar(demo_target, hf_oracle, method):  # noqa: F811
    eng = make_engine(demo_target, method, 4 if method == "ngram" else 3)
    try:
        prompts = [p for p, _ in hf_oracle]
        outs = eng.generate(prompts, [SamplingParams(max_tokens=48, temperature=0.0, guide=GuideSpec(k, t))
                                      for k, t in ORACLE_GUIDES])
        for (kind, text), (_, expected), got in zip(ORACLE_GUIDES, hf_oracle, outs):
            assert output_token_ids(got) == expected, (kind, text[:40])
        assert eng.scheduler.spec_counters.num_accepted_tokens > 0
    finally:
        eng.shutdown()


@pytest.mark.parametrize("method, adaptive", [("ngram", False), ("draft", True)])
def test_sampled_guided_outputs_are_valid_with_speculation(demo_target, tokenizer, method, adaptive):
    """Temperature 1, top-p 1 over every shared guide, two seeds each: what finishes ``stop`` validates,
    the rest was cut by max_tokens and says ``length``."""
    jobs, prompts = guided_jobs(tokenizer)
    jobs, prompts = jobs * 2, prompts * 2
    eng = make_engine(demo_target, method, 4, adaptive)
    audit = DraftAudit(eng)
    try:
        outs = eng.generate(prompts, [SamplingParams(max_tokens=64, temperature=1.0, top_p=1.0, seed=500 + i,
                                                     guide=GuideSpec(kind, text)) for i, (kind, text) in enumerate(jobs)])
        stops = 0
        for (kind, text), o in zip(jobs, outs):
            ids, last = output_token_ids(o), o[-1]
            assert last.error is None, last.error
            if last.finish_reason is FinishReason.STOP:
                stops += 1
                assert ids[-1] == 1
                out = tokenizer.decode(ids, skip_special_tokens=True)
                assert check_output(kind, text, out) is None, (kind, text[:40], out)
            else:
                assert last.finish_reason is FinishReason.LENGTH and len(ids) == 64
        assert stops >= len(jobs) // 2
        assert eng.scheduler.spec_counters.num_accepted_tokens > 0
        audit.check()
        if method == "draft":
            assert any(from_q for _, _, from_q in audit.records), "no sampled draft-model drafts were verified"
        assert blocks_in_use(eng) == (0, 0)
    finally:
        eng.shutdown()


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_mixed_batch_under_preemption_and_prefix_hits(demo_target, tokenizer, method):
    """Guided and unguided greedy requests in one small pool (preemption) with a shared prompt stem
    (prefix-cache hits): each output equals the one without speculation; no target or draft block stays."""
    stem = tokenizer.encode("# records, one per line, as JSON objects\n" + EXAMPLE, add_special_tokens=True)
    guides = [(k, t) for _, k, t in all_guides()][::2]
    prompts, params = [], []
    for i, (kind, text) in enumerate(guides):
        prompts += [stem + [7 + i], stem + [40 + i]]
        params += [SamplingParams(max_tokens=40, temperature=0.0, guide=GuideSpec(kind, text)),
                   SamplingParams(max_tokens=24, temperature=0.0)]
    ref = make_engine(demo_target)
    try:
        expected = [output_token_ids(o) for o in ref.generate(prompts, params)]
    finally:
        ref.shutdown()
    # fixed k: the adaptive policy may rightly switch the draft model off here before any draft is accepted
    eng = make_engine(demo_target, method, 3, False, num_kv_blocks=16, block_size=16, watermark=0.0,
                      max_model_len=256, max_num_seqs=16)
    audit = DraftAudit(eng)
    try:
        outs = eng.generate(prompts, params)
        assert [output_token_ids(o) for o in outs] == expected
        s = eng.stats()
        assert s.num_preemptions > 0 and s.prefix_cache_hits > 0 and s.spec.num_accepted_tokens > 0
        audit.check()
        assert blocks_in_use(eng) == (0, 0)
    finally:
        eng.shutdown()


def test_draft_model_kv_stays_consistent_across_grammar_cuts(demo_target, tokenizer):
    """Drafts past a cut were fed to the draft model but never verified: its K/V for them must be rolled
    back. Every greedy proposal must equal the draft model's own greedy continuation of the verified
    tokens, recomputed densely without a cache (stale K/V would change it)."""
    from tests.helpers.oracle import dense_greedy

    jobs, prompts = guided_jobs(tokenizer)
    eng = make_engine(demo_target, "draft", 4)
    proposer = eng.speculator.proposer
    propose, checked = proposer.propose, []

    def checking(seqs, ks, grammar=None):
        out = propose(seqs, ks)                    # unconstrained drafts: the draft model's own greedy run
        for seq in seqs:
            drafts = out.draft_token_ids.get(seq.seq_id)
            if drafts and len(checked) < 60:
                checked.append(drafts == dense_greedy(proposer.model, seq.all_token_ids, len(drafts)))
        return out
    proposer.propose = checking
    try:
        eng.generate(prompts, [SamplingParams(max_tokens=48, temperature=0.0, guide=GuideSpec(kind, text))
                               for kind, text in jobs])
        assert len(checked) == 60 and all(checked), checked
        assert eng.speculator.num_cut_draft_tokens > 0 and blocks_in_use(eng) == (0, 0)
    finally:
        eng.shutdown()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_draft_model_drafts_under_the_grammar_mask(demo_target, tokenizer, temperature):
    """Every guided proposal of the draft model is grammar-valid as drafted (up to an EOS, after which the
    grammar has ended), the matchers are back at the verified state after it, and masked drafting gets
    more drafts accepted than the same run drafting without the mask (greedy: deterministic)."""
    jobs, prompts = guided_jobs(tokenizer)
    params = [SamplingParams(max_tokens=48, temperature=temperature, seed=70 + i, guide=GuideSpec(kind, text))
              for i, (kind, text) in enumerate(jobs)]
    accepted = {}
    for masked in (True, False):
        eng = make_engine(demo_target, "draft", 4)
        so, propose, seen = eng.structured, eng.speculator.proposer.propose, []

        def checking(seqs, ks, grammar=None, masked=masked, so=so, propose=propose, seen=seen):
            out = propose(seqs, ks, grammar if masked else None)
            for seq in seqs:
                drafts = out.draft_token_ids.get(seq.seq_id)
                if masked and drafts and seq.params.guide is not None:
                    end = drafts.index(1) + 1 if 1 in drafts else len(drafts)
                    seen.append(so.valid_draft_prefix(seq, drafts) == end)
            return out
        eng.speculator.proposer.propose = checking
        try:
            outs = eng.generate(prompts, params)
            assert all(o[-1].error is None for o in outs)
            accepted[masked] = eng.scheduler.spec_counters.num_accepted_tokens
            assert blocks_in_use(eng) == (0, 0)
        finally:
            eng.shutdown()
        if masked:
            assert seen and all(seen)
    if temperature == 0.0:
        assert accepted[True] > accepted[False], accepted


class ScriptedProposer(Proposer):
    """Proposes the next tokens of a fixed continuation (whatever the sequence has produced so far)."""

    method = "scripted"

    def __init__(self, script: list[int]):
        self.script = script

    def propose(self, seqs, num_drafts, grammar=None):
        out = Proposal()
        for seq, k in zip(seqs, num_drafts):
            drafts = self.script[seq.num_output_tokens:seq.num_output_tokens + k]
            if drafts:
                out.draft_token_ids[seq.seq_id] = drafts
        return out


def test_eos_inside_an_accepted_run_finishes_with_stop(demo_target, tokenizer):
    """Drafts ``7 z EOS x`` after ``q`` under the regex ``q7z`` (no token of the demo vocabulary spans
    two of its characters): ``x`` is cut (the grammar has ended), ``7 z EOS`` are accepted in one
    verification, the bonus token after EOS is dropped, and the request finishes ``stop`` with exactly
    ``q 7 z EOS``."""
    a, b, c, x = (tokenizer.encode(ch, add_special_tokens=False)[0] for ch in "q7zx")
    eng = make_engine(demo_target, "ngram", 4)
    eng.speculator.proposer = ScriptedProposer([a, b, c, 1, x, x])
    try:
        outs = eng.generate([tokenizer.encode("x = ", add_special_tokens=True)],
                            SamplingParams(max_tokens=16, temperature=0.0, guide=GuideSpec("regex", "q7z")))[0]
        assert outs[-1].error is None and outs[-1].finish_reason is FinishReason.STOP
        assert output_token_ids(outs) == [a, b, c, 1]
        spec = eng.scheduler.spec_counters
        assert (spec.num_draft_tokens, spec.num_accepted_tokens) == (3, 3)     # one verification: 7 z EOS
        assert eng.speculator.num_cut_draft_tokens == 1                         # x
        assert blocks_in_use(eng) == (0, 0)
    finally:
        eng.shutdown()


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_jump_forward_composes_with_speculation(demo_target, tokenizer, method):
    """A step that appended forced tokens computes them without drafts, the next one speculates again:
    greedy output equals jump-forward without speculation, both save forward passes."""
    kinds = [("json_schema", json.dumps(SCHEMAS[n])) for n in ("nested_object", "enums",
                                                                              "list_of_records")] + [("json", "")]
    prompts = [tokenizer.encode(PROMPTS[i % len(PROMPTS)], add_special_tokens=True) for i in range(len(kinds))]
    params = [SamplingParams(max_tokens=48, temperature=0.0, guide=GuideSpec(k, t)) for k, t in kinds]
    ref = make_engine(demo_target, guided_jump_forward=True)
    try:
        expected = [output_token_ids(o) for o in ref.generate(prompts, params)]
    finally:
        ref.shutdown()
    eng = make_engine(demo_target, method, 4, guided_jump_forward=True)
    audit = DraftAudit(eng)
    try:
        outs = eng.generate(prompts, params)
        assert [output_token_ids(o) for o in outs] == expected
        assert eng.structured.num_forced_tokens > 0 and eng.scheduler.spec_counters.num_accepted_tokens > 0
        audit.check()
        assert blocks_in_use(eng) == (0, 0)
    finally:
        eng.shutdown()


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_parallel_samples_speculate_each_with_its_own_grammar_state(demo_target, tokenizer, method):
    kind, text = "json_schema", json.dumps(SCHEMAS["list_of_records"])
    eng = make_engine(demo_target, method, 4)
    try:
        outs = eng.generate([tokenizer.encode(PROMPTS[2], add_special_tokens=True)],
                            SamplingParams(max_tokens=64, temperature=1.0, seed=9, n=4, guide=GuideSpec(kind, text)))[0]
        assert {o.seq_index for o in outs} == {0, 1, 2, 3}
        for i in range(4):
            final = [o for o in outs if o.seq_index == i and o.finished][-1]
            assert final.error is None
            if final.finish_reason is FinishReason.STOP:
                out = tokenizer.decode(output_token_ids(outs, i), skip_special_tokens=True)
                assert check_output(kind, text, out) is None, out
        assert eng.scheduler.spec_counters.num_draft_tokens > 0 and blocks_in_use(eng) == (0, 0)
    finally:
        eng.shutdown()
