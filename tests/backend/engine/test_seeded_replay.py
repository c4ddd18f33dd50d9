"""Seeded sampling replays exactly: the same tokens, and bit-identical logits at every position, whatever the
speculation, the batch, preemption or the prefix cache (docs/sampling.md, "Replay").

64 seeded requests x 128 tokens on the demo target through the native fast step (fp32), sampled at temperatures
0.7-1.3 with top-k / top-p. The reference runs them among 31 others without speculation; the first 16 run alone
(one sequence at a time) too, with and without speculation, and must give the same tokens. Then all 64 again in
that engine (prompt blocks from the prefix cache), with preemption (a KV pool too small for 32), and with n-gram
speculation at fixed k 1, 4 (among 7) and 8 and adaptive. A draft model's configuration uses the Gumbel rule: its
outputs equal the same configuration with speculation off per request, among 31 and alone. int8 / int4 weights
replay the same way. Every logits row the runner samples is recorded by (request, position) where its drafts
were then accepted, and must be bit-equal in every run that computed it.
"""
from __future__ import annotations

import hashlib

import pytest

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine, output_token_ids
from contracts.sampling_params import SamplingParams
from tests.helpers.checkpoints import DEMO_DRAFT

SEEDS = 64
ALONE = 16          # the seeds also run one sequence at a time (the costly runs: one token per step)
TOKENS = 128
TEXTS = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
         "The cat sat on the mat. The dog sat on the log. The bird sat on the",
         'config = {"name": "demo", "size": 3, "tags": ["a", "b"]}\nother = {"name": ',
         "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(j)\nfor k in range(",
         "Once upon a time there was a small town by the sea. Every morning the"]


def params(i: int, num_speculative_tokens: int | None = None) -> SamplingParams:
    return SamplingParams(max_tokens=TOKENS, ignore_eos=True, seed=7919 * i + 3, temperature=(0.7, 1.0, 1.3)[i % 3],
                          top_p=(1.0, 0.95)[i % 2], top_k=(0, 50, 0, 200)[i % 4],
                          num_speculative_tokens=num_speculative_tokens)


class LogitsRecorder:
    """Wraps the runner's ``sample``: hashes every logits row by (draw rule and weight format, prompt index, output position),
    keeping a verify row only if the drafts before it are then accepted (the row's context is the real output)."""

    def __init__(self):
        self.rows: dict[tuple[str, str, int], set[str]] = {}

    def attach(self, engine: LLMEngine) -> None:
        # distributions differ across these
        rule = f"{engine.runner.sampler.rule.value}/{engine.config.model.quantization}"
        sample = engine.runner.sample

        def recorded(plan, forward, grammar_bitmask=None, draft_probs=None):
            out = sample(plan, forward, grammar_bitmask=grammar_bitmask, draft_probs=draft_probs)
            if forward.logits is not None:
                logits = forward.logits.numpy()
                row = 0
                for i in dict.fromkeys(forward.rows):
                    s = plan.scheduled[i]
                    drafts = s.seq.draft_token_ids[:s.num_draft_tokens]
                    accepted = len(out.sampled_token_ids[i]) - 1 if drafts else 0
                    for j in range(accepted + 1):
                        key = (rule, s.seq.request_id.rsplit("-", 1)[1], len(s.seq.output_token_ids) + j)
                        self.rows.setdefault(key, set()).add(hashlib.sha1(logits[row + j].tobytes()).hexdigest())
                    row += s.num_draft_tokens + 1
            return out
        engine.runner.sample = recorded

    def check(self) -> int:
        differ = [k for k, v in self.rows.items() if len(v) > 1]
        assert not differ, f"{len(differ)} positions got different logits, e.g. {differ[:3]}"
        return len(self.rows)


@pytest.fixture(scope="module")
def prompts(demo_target):
    from preprocess.tokenizer import load_tokenizer

    tok = load_tokenizer(demo_target)
    return [tok.encode(TEXTS[i % len(TEXTS)] + " " * (i % 3), add_special_tokens=True) for i in range(SEEDS)]


@pytest.fixture(scope="module")
def recorder():
    rec = LogitsRecorder()
    yield rec
    assert rec.check() >= SEEDS * TOKENS // 2


def engine(demo_target, recorder, **kw) -> LLMEngine:
    cfg = dict(model_path=str(demo_target), device="cpu", fast_decode=True, kv_cache_bytes=32 << 20,
               max_num_seqs=32, speculative_adaptive=False, cpu_threads=1)
    cfg.update(kw)
    eng = LLMEngine(EngineConfig.from_settings(**cfg))
    recorder.attach(eng)
    return eng


def run(eng: LLMEngine, prompts, plist) -> list[list[int]]:
    outs = eng.generate(prompts, plist)
    for o in outs:
        assert o[-1].error is None, o[-1].error
    return [output_token_ids(o) for o in outs]


def assert_same(got, want, what):
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not bad, f"{what}: {len(bad)} of {len(want)} seeds differ (first: {bad[:5]})"


@pytest.fixture(scope="module")
def reference(demo_target, prompts, recorder):
    """Among 31 others, without speculation; run twice in one engine, the second time from the prefix cache."""
    eng = engine(demo_target, recorder)
    try:
        first = run(eng, prompts, [params(i) for i in range(SEEDS)])
        before = eng.stats().prefix_cache_hits
        assert_same(run(eng, prompts, [params(i) for i in range(SEEDS)]), first, "prefix-cache hit")
        assert eng.stats().prefix_cache_hits > before
        return first
    finally:
        eng.shutdown()


@pytest.mark.parametrize("speculation", [{}, dict(speculative_method="ngram", num_speculative_tokens=8,
                                                  speculative_adaptive=True)], ids=["plain", "ngram-adaptive"])
def test_alone_as_among_31_and_again_from_the_prefix_cache(demo_target, prompts, recorder, reference, speculation):
    eng = engine(demo_target, recorder, max_num_seqs=1, **speculation)
    try:
        assert_same(run(eng, prompts[:ALONE], [params(i) for i in range(ALONE)]), reference[:ALONE], "alone")
        if speculation:
            assert eng.scheduler.spec_counters.num_accepted_tokens > 0
    finally:
        eng.shutdown()


def test_after_preemption(demo_target, prompts, recorder, reference):
    eng = engine(demo_target, recorder, kv_cache_bytes=None, num_kv_blocks=96, enable_prefix_caching=False)
    try:
        assert_same(run(eng, prompts, [params(i) for i in range(SEEDS)]), reference, "preempted")
        assert eng.stats().num_preemptions > 0
    finally:
        eng.shutdown()


@pytest.mark.parametrize("k,adaptive,batch", [(1, False, 32), (4, False, 8), (8, False, 32), (8, True, 32)])
def test_ngram_speculation(demo_target, prompts, recorder, reference, k, adaptive, batch):
    """``batch``: the most sequences running at once (8: among 7 others; 32: among 31)."""
    eng = engine(demo_target, recorder, speculative_method="ngram", num_speculative_tokens=k,
                 speculative_adaptive=adaptive, max_num_seqs=batch)
    try:
        assert_same(run(eng, prompts, [params(i) for i in range(SEEDS)]), reference, f"ngram k={k}")
        assert eng.scheduler.spec_counters.num_accepted_tokens > 0
    finally:
        eng.shutdown()


def test_draft_model_with_the_gumbel_rule(demo_target, prompts, recorder):
    """Speculation off per request (k = 0) against k = 4 among 31, and adaptive alone, in one configuration."""
    kw = dict(speculative_method="draft", draft_model_path=str(DEMO_DRAFT), num_speculative_tokens=4)
    n = SEEDS // 2
    off = engine(demo_target, recorder, **kw)
    try:
        plain = run(off, prompts[:n], [params(i, num_speculative_tokens=0) for i in range(n)])
        assert off.scheduler.spec_counters.num_draft_tokens == 0
    finally:
        off.shutdown()
    for adaptive, alone in ((False, False), (True, True)):
        m = ALONE if alone else n
        eng = engine(demo_target, recorder, max_num_seqs=1 if alone else 32, **dict(kw, speculative_adaptive=adaptive))
        try:
            assert_same(run(eng, prompts[:m], [params(i) for i in range(m)]), plain[:m], f"draft adaptive={adaptive}")
            assert eng.scheduler.spec_counters.num_accepted_tokens > 0
        finally:
            eng.shutdown()


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_quantized_weights_on_the_fast_step(demo_target, prompts, recorder, quantization):
    """int8 / int4 weights (int4 in groups of 64: the demo's 192 features) through the native step's quantized GEMM:
    among 31 without speculation, alone, and among 31 with adaptive n-gram speculation and preemption."""
    n = SEEDS // 2
    quant = dict(quantization=quantization, quantization_group_size=64)
    batched = engine(demo_target, recorder, **quant)
    try:
        assert batched.runner.fast_decode is not None, "the native step should serve quantized weights"
        want = run(batched, prompts[:n], [params(i) for i in range(n)])
    finally:
        batched.shutdown()
    alone = engine(demo_target, recorder, max_num_seqs=1, **quant)
    try:
        assert_same(run(alone, prompts[:ALONE], [params(i) for i in range(ALONE)]), want[:ALONE],
                    f"{quantization} alone")
    finally:
        alone.shutdown()
    eng = engine(demo_target, recorder, **quant, speculative_method="ngram", num_speculative_tokens=8,
                 speculative_adaptive=True, kv_cache_bytes=None, num_kv_blocks=96, enable_prefix_caching=False)
    try:
        assert_same(run(eng, prompts[:n], [params(i) for i in range(n)]), want, f"{quantization} among 31")
        assert eng.stats().num_preemptions > 0
    finally:
        eng.shutdown()
