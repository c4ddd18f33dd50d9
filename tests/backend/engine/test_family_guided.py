"""Guided decoding composed with draft-model and n-gram speculation on a Qwen3 target and on a Gemma 3 one (a sliding
layer, soft-capped logits): each a random checkpoint written by transformers' own config class and, as its draft, the
one-layer model of its family drawn from the same seed (the same tokenizer and tied embeddings). Every shared guide
(JSON schemas, regexes, EBNF grammars, structural tags, free JSON), greedy, on the native step: the output with
speculation equals the output without, token for token; the drafts a guided sequence verifies are grammar-valid; each
output that ends is valid for its guide; every target and draft block is free afterwards."""
from __future__ import annotations

import pytest

from backend.config import EngineConfig
from backend.core.outputs import FinishReason
from backend.engine.llm_engine import LLMEngine, output_token_ids
from bench.harness.guides import all_guides
from contracts.sampling_params import GuideSpec, SamplingParams
from grammar import check_output
from tests.backend.spec_decode.test_guided_speculation import PROMPTS, DraftAudit, blocks_in_use
from tests.helpers.families import make_family_checkpoint

MAX_TOKENS = 48


@pytest.fixture(scope="module", params=["gemma3", "qwen3"])
def pair(request, tmp_path_factory):
    """(target, draft) of one family."""
    family, root = request.param, tmp_path_factory.mktemp(request.param)
    target = make_family_checkpoint(root / "target", family, tie_word_embeddings=True)
    draft = make_family_checkpoint(root / "draft", family, tie_word_embeddings=True, num_hidden_layers=1)
    return target, draft


@pytest.fixture(scope="module")
def jobs(pair):
    from preprocess.tokenizer import load_tokenizer

    tok = load_tokenizer(pair[0])
    guides = [(kind, text) for _, kind, text in all_guides()]
    prompts = [tok.encode(PROMPTS[i % len(PROMPTS)], add_special_tokens=True) for i in range(len(guides))]
    return tok, guides, prompts


def run(pair, jobs, **kw):
    target, draft = pair
    tok, guides, prompts = jobs
    cfg = dict(model_path=str(target), kv_cache_bytes=16 << 20, device="cpu", max_num_seqs=64, fast_decode=True)
    if kw.get("speculative_method") == "draft":
        kw["draft_model_path"] = str(draft)
    eng = LLMEngine(EngineConfig.from_settings(**cfg, **kw))
    audit = DraftAudit(eng) if kw else None
    try:
        outs = eng.generate(prompts, [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, guide=GuideSpec(k, t))
                                      for k, t in guides])
        for o in outs:
            assert o[-1].error is None, o[-1].error
        if audit is not None:
            spec = eng.scheduler.spec_counters
            assert spec.num_draft_tokens > 0 and spec.num_accepted_tokens > 0
            audit.check()
            assert blocks_in_use(eng) == (0, 0)
        else:
            assert eng.stats().kv_blocks_used == 0
        return outs
    finally:
        eng.shutdown()


@pytest.fixture(scope="module")
def plain(pair, jobs):
    """Without speculation; each output that stops is valid for its guide."""
    tok, guides, _ = jobs
    outs = run(pair, jobs)
    stops = 0
    for (kind, text), o in zip(guides, outs):
        if o[-1].finish_reason is FinishReason.STOP:
            stops += 1
            out = tok.decode(output_token_ids(o), skip_special_tokens=True)
            assert check_output(kind, text, out) is None, (kind, text[:40], out, check_output(kind, text, out))
    assert stops >= len(guides) / 2, f"only {stops} of {len(guides)} guided outputs ended"
    return [output_token_ids(o) for o in outs]


@pytest.mark.parametrize("method, k, adaptive", [("draft", 3, False), ("draft", 4, True), ("ngram", 3, False)])
def test_greedy_guided_output_is_the_same_with_speculation(pair, jobs, plain, method, k, adaptive):
    _, guides, _ = jobs
    outs = run(pair, jobs, speculative_method=method, num_speculative_tokens=k, speculative_adaptive=adaptive)
    for (kind, text), got, expected in zip(guides, outs, plain):
        assert output_token_ids(got) == expected, (method, kind, text[:40])
