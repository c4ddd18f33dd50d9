"""Seeded replay on a Qwen3 checkpoint (q/k norms on the native step) and on a Gemma 3 one (a sliding layer, its
sandwich norms, soft-capped logits): 32 seeded requests x 128 tokens on a random checkpoint of each written by
transformers' own config class, sampled at temperatures 0.7-1.3 with top-k / top-p. The reference runs them among 31
others without speculation, streaming every token; the same tokens come back streamed in spans of 16
(``stream_interval``), from the prefix cache, alone (one sequence at a time) with and without n-gram speculation, among
31 with n-gram speculation under preemption; and with a draft model (the one-layer model of the family sharing the
tokenizer and the embeddings, the Gumbel rule) equal to the same configuration with speculation off per request, among
31 and alone. Every logits row the runner samples is bit-equal in every run that computed it (``LogitsRecorder``).
Through the server (stream or not on the wire): tests/e2e/test_family_serving.py."""
from __future__ import annotations

import pytest

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from tests.backend.engine.test_seeded_replay import TOKENS, LogitsRecorder, assert_same, params, run
from tests.helpers.families import make_family_checkpoint
from tests.helpers.oracle import repeating_prompts

SEEDS = 32
ALONE = 8


@pytest.fixture(scope="module", params=["gemma3", "qwen3"])
def pair(request, tmp_path_factory):
    """(target, draft): a two-layer model of the family and the one-layer one drawn from the same seed (the same
    embeddings, tied, and first layer), so the draft's proposals are accepted often but not always."""
    family, root = request.param, tmp_path_factory.mktemp(request.param)
    target = make_family_checkpoint(root / "target", family, tie_word_embeddings=True)
    draft = make_family_checkpoint(root / "draft", family, tie_word_embeddings=True, num_hidden_layers=1)
    return target, draft


@pytest.fixture(scope="module")
def prompts():
    return repeating_prompts(11, SEEDS, stem_len=12, span_range=(6, 12), gap_range=(3, 10))


@pytest.fixture(scope="module")
def recorder(pair):
    rec = LogitsRecorder()
    yield rec
    assert rec.check() >= SEEDS * TOKENS // 2


def engine(folder, recorder, **kw) -> LLMEngine:
    cfg = dict(model_path=str(folder), device="cpu", fast_decode=True, kv_cache_bytes=16 << 20, max_num_seqs=32,
               speculative_adaptive=False, cpu_threads=1)
    cfg.update(kw)
    eng = LLMEngine(EngineConfig.from_settings(**cfg))
    assert eng.runner.fast_decode is not None, f"the native step should serve {folder}"
    recorder.attach(eng)
    return eng


def seeded(n: int, **kw):
    return [params(i, **kw) for i in range(n)]


@pytest.fixture(scope="module")
def reference(pair, prompts, recorder):
    """Among 31 others without speculation, every token streamed; again streamed 16 at a time, from the prefix
    cache."""
    eng = engine(pair[0], recorder)
    try:
        first = run(eng, prompts, seeded(SEEDS))
        assert len({tuple(t) for t in first}) == SEEDS, "different seeds should give different outputs"
    finally:
        eng.shutdown()
    eng = engine(pair[0], recorder, stream_interval=16)
    try:
        assert_same(run(eng, prompts, seeded(SEEDS)), first, "streamed 16 at a time")
        before = eng.stats().prefix_cache_hits
        assert_same(run(eng, prompts, seeded(SEEDS)), first, "prefix-cache hit")
        assert eng.stats().prefix_cache_hits > before
    finally:
        eng.shutdown()
    return first


@pytest.mark.parametrize("speculation", [{}, dict(speculative_method="ngram", num_speculative_tokens=4)],
                         ids=["plain", "ngram"])
def test_alone_as_among_31(pair, prompts, recorder, reference, speculation):
    eng = engine(pair[0], recorder, max_num_seqs=1, **speculation)
    try:
        assert_same(run(eng, prompts[:ALONE], seeded(ALONE)), reference[:ALONE], "alone")
        if speculation:
            assert eng.scheduler.spec_counters.num_accepted_tokens > 0
    finally:
        eng.shutdown()


def test_ngram_among_31_under_preemption(pair, prompts, recorder, reference):
    eng = engine(pair[0], recorder, speculative_method="ngram", num_speculative_tokens=4,
                 kv_cache_bytes=None, num_kv_blocks=48, enable_prefix_caching=False)
    try:
        assert_same(run(eng, prompts, seeded(SEEDS)), reference, "ngram, preempted")
        assert eng.scheduler.spec_counters.num_accepted_tokens > 0
        assert eng.stats().num_preemptions > 0
    finally:
        eng.shutdown()


def test_draft_model_with_the_gumbel_rule(pair, prompts, recorder):
    target, draft = pair
    kw = dict(speculative_method="draft", draft_model_path=str(draft), num_speculative_tokens=4)
    off = engine(target, recorder, **kw)
    try:
        plain = run(off, prompts, seeded(SEEDS, num_speculative_tokens=0))
        assert off.scheduler.spec_counters.num_draft_tokens == 0
    finally:
        off.shutdown()
    for adaptive, alone in ((False, False), (True, True)):
        m = ALONE if alone else SEEDS
        eng = engine(target, recorder, max_num_seqs=1 if alone else 32, **dict(kw, speculative_adaptive=adaptive))
        try:
            assert_same(run(eng, prompts[:m], seeded(m)), plain[:m], f"draft adaptive={adaptive} alone={alone}")
            counters = eng.scheduler.spec_counters
            assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens, "some drafts accepted, not all"
        finally:
            eng.shutdown()
