"""``logit_bias`` through the engine on the demo target (native fast step): +100 forces a greedy token and -100
bans it; the grammar mask wins over any bias; a seeded request with a bias replays exactly alone, among others and
with n-gram or draft-model speculation; greedy biased requests give the same tokens with speculation as without.
Token ids outside the vocabulary are refused naming the field."""
from __future__ import annotations

import re
from collections import Counter

import pytest

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine, output_token_ids
from contracts.sampling_params import GuideSpec, SamplingParams
from tests.helpers.checkpoints import DEMO_DRAFT

TEXTS = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
         "The cat sat on the mat. The dog sat on the log. The bird sat on the",
         "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(j)\nfor k in range(",
         'config = {"name": "demo", "size": 3}\nother = {"name": ']
REQUESTS = 12
TOKENS = 40


@pytest.fixture(scope="module")
def tokenizer(demo_target):
    from preprocess.tokenizer import load_tokenizer

    return load_tokenizer(demo_target)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.encode(TEXTS[i % len(TEXTS)] + " " * (i // len(TEXTS)), add_special_tokens=True)
            for i in range(REQUESTS)]


def make_engine(demo_target, **kw) -> LLMEngine:
    cfg = dict(model_path=str(demo_target), device="cpu", fast_decode=True, kv_cache_bytes=32 << 20,
               max_num_seqs=32, speculative_adaptive=False, cpu_threads=1)
    cfg.update(kw)
    return LLMEngine(EngineConfig.from_settings(**cfg))


def run(eng: LLMEngine, prompts, plist) -> list[list[int]]:
    outs = eng.generate(prompts, plist)
    for o in outs:
        assert o[-1].error is None, o[-1].error
    return [output_token_ids(o) for o in outs]


def params(i: int, bias=(), **kw) -> SamplingParams:
    """Even requests greedy, odd ones sampled with their own seed."""
    sampled = dict(temperature=(0.8, 1.1)[i // 2 % 2], top_p=(1.0, 0.95)[i // 2 % 2], seed=7919 * i + 3) \
        if i % 2 else dict(temperature=0.0)
    return SamplingParams(max_tokens=TOKENS, ignore_eos=True, logit_bias=tuple(bias), **{**sampled, **kw})


@pytest.fixture(scope="module")
def plain(demo_target, prompts):
    """Without bias, then each request with a bias made from its own unbiased output: -100 on its most frequent
    token, +2.5 on its second (so the bias changes every output); both among the others, no speculation."""
    eng = make_engine(demo_target)
    try:
        unbiased = run(eng, prompts, [params(i) for i in range(REQUESTS)])
        biases = []
        for out in unbiased:
            (top, _), (second, _) = Counter(out).most_common(2)
            biases.append(((top, -100.0), (second, 2.5)))
        biased = run(eng, prompts, [params(i, b) for i, b in enumerate(biases)])
        return unbiased, biases, biased
    finally:
        eng.shutdown()


def assert_same(got, want, what):
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not bad, f"{what}: {len(bad)} of {len(want)} requests differ (first: {bad[:5]})"


def test_the_bias_changes_every_output_and_minus_100_bans(plain):
    unbiased, biases, biased = plain
    for i, (u, b, out) in enumerate(zip(unbiased, biases, biased)):
        assert out != u, i
        banned = b[0][0]
        assert banned not in out, (i, banned, out)


def test_plus_100_forces_a_greedy_token(demo_target, prompts, tokenizer):
    target = tokenizer.encode(" banana", add_special_tokens=False)[0]
    eng = make_engine(demo_target)
    try:
        out, = run(eng, prompts[:1], [SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True,
                                                      logit_bias=((target, 100.0),))])
        assert out == [target] * 6
        with pytest.raises(ValueError, match=r"^logit_bias: token id 4096 is outside the vocabulary \[0, 4096\)"):
            eng.add_request("oov", prompts[0], SamplingParams(logit_bias=((4096, 1.0),)), lambda o: None)
    finally:
        eng.shutdown()


def test_alone_as_among_others(demo_target, prompts, plain):
    _, biases, biased = plain
    eng = make_engine(demo_target, max_num_seqs=1)
    try:
        assert_same(run(eng, prompts, [params(i, b) for i, b in enumerate(biases)]), biased, "alone")
    finally:
        eng.shutdown()


@pytest.mark.parametrize("k,adaptive,batch", [(4, False, 32), (8, True, 1)])
def test_ngram_speculation_replays_biased_requests(demo_target, prompts, plain, k, adaptive, batch):
    _, biases, biased = plain
    eng = make_engine(demo_target, speculative_method="ngram", num_speculative_tokens=k,
                      speculative_adaptive=adaptive, max_num_seqs=batch)
    try:
        assert_same(run(eng, prompts, [params(i, b) for i, b in enumerate(biases)]), biased, f"ngram k={k}")
        assert eng.scheduler.spec_counters.num_accepted_tokens > 0
    finally:
        eng.shutdown()


def test_draft_model_speculation_replays_biased_requests(demo_target, prompts, plain):
    """Gumbel coupling: the same configuration with speculation off per request (k = 0) and on (k = 4); greedy
    biased requests also equal the plain engine's (verification is lossless, the bias is in the target's rows)."""
    _, biases, biased = plain
    kw = dict(speculative_method="draft", draft_model_path=str(DEMO_DRAFT), num_speculative_tokens=4)
    eng = make_engine(demo_target, **kw)
    try:
        off = run(eng, prompts, [params(i, b, num_speculative_tokens=0) for i, b in enumerate(biases)])
        on = run(eng, prompts, [params(i, b) for i, b in enumerate(biases)])
        assert eng.scheduler.spec_counters.num_accepted_tokens > 0
    finally:
        eng.shutdown()
    assert_same(on, off, "draft k=4 against k=0")
    greedy = range(0, REQUESTS, 2)
    assert_same([on[i] for i in greedy], [biased[i] for i in greedy], "greedy, draft against plain")


DIGITS = r"[0-9]{6}"


@pytest.mark.parametrize("speculation", [{}, dict(speculative_method="ngram", num_speculative_tokens=4)],
                         ids=["plain", "ngram"])
def test_the_grammar_mask_wins_over_the_bias(demo_target, prompts, tokenizer, speculation):
    """Under a six-digit regex: +100 on letters is never taken, +100 on a digit's token makes it every digit
    (greedy), -100 on every digit but one leaves only that one; sampled requests stay valid too."""
    vocab = tokenizer.vocab_size
    digit = {d: tokenizer.encode(d, add_special_tokens=False) for d in "0123456789"}
    assert all(len(ids) == 1 for ids in digit.values()), digit
    letters = [t for t in range(vocab) if re.fullmatch(r"[A-Za-z ]+", tokenizer.decode([t]) or "")][:50]
    assert len(letters) == 50
    eng = make_engine(demo_target, **speculation)
    guide = GuideSpec("regex", DIGITS)
    try:
        cases = [tuple((t, 100.0) for t in letters), ((digit["7"][0], 100.0),),
                 tuple((digit[d][0], -100.0) for d in "012345689")]
        plist = [SamplingParams(max_tokens=12, temperature=t, seed=s, guide=guide, logit_bias=c)
                 for c in cases for t, s in ((0.0, None), (1.0, 5))]
        outs = eng.generate([prompts[0]] * len(plist), plist)
    finally:
        eng.shutdown()
    texts = []
    for o in outs:
        assert o[-1].error is None, o[-1].error
        texts.append(tokenizer.decode(output_token_ids(o), skip_special_tokens=True))
    assert all(re.fullmatch(DIGITS, t) for t in texts), texts
    assert texts[2] == texts[3] == "777777" and texts[4] == texts[5] == "777777", texts
