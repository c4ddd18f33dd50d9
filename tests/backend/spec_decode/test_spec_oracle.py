"""Oracle for speculative decoding: with ngram or draft-model speculation (k = 1..4, adaptive on and
off), greedy outputs equal HF transformers' token for token, alone and under concurrency with
staggered arrivals, chunked prefill, prefix-cache hits and preemption; afterwards every KV block of
the target and of the draft is free again. Abort in the middle of speculation frees everything."""
from __future__ import annotations

import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from backend.config import EngineConfig
from backend.core.outputs import FinishReason
from backend.engine.llm_engine import LLMEngine, output_token_ids
from contracts.sampling_params import SamplingParams
from tests.backend.engine.test_engine_oracle import check_greedy_matches
from tests.helpers.checkpoints import DEMO_DRAFT
from tests.helpers.oracle import hf_greedy, repeating_prompts

NEW_TOKENS = 24


def make_prompts(seed: int, n: int = 12) -> list[list[int]]:
    """Prompts of 8..60 tokens; half share a stem (prefix hits), most repeat a span (n-gram matches)."""
    return repeating_prompts(seed, n, stem_len=24, span_range=(4, 12), gap_range=(0, 6))


@pytest.fixture(scope="module", params=["tiny", "demo"])
def setup(request, tiny_checkpoint):
    if request.param == "tiny":
        folder, draft = tiny_checkpoint, tiny_checkpoint      # a draft equal to the target: every draft accepted
    else:
        folder, draft = request.getfixturevalue("demo_target"), DEMO_DRAFT
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    prompts = make_prompts(seed=3)
    return folder, draft, prompts, [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]


CASES = [  # (method, k, adaptive, variant)
    ("ngram", 1, False, "plain"), ("ngram", 4, True, "chunked_prefill"), ("ngram", 3, False, "preemption"),
    ("ngram", 2, True, "no_prefix_cache"), ("draft", 1, True, "plain"), ("draft", 4, False, "chunked_prefill"),
    ("draft", 2, True, "preemption"), ("draft", 3, False, "plain"), ("ngram", 4, False, "fast_decode"),
]


def engine_config(folder, draft, method, k, adaptive, variant) -> EngineConfig:
    kw = dict(model_path=str(folder), max_num_seqs=16, kv_cache_bytes=32 << 20, speculative_method=method,
              num_speculative_tokens=k, speculative_adaptive=adaptive, device="cpu")
    if method == "draft":
        kw["draft_model_path"] = str(draft)
    if variant == "chunked_prefill":
        kw["max_num_batched_tokens"] = 8
    if variant == "preemption":
        kw.update(num_kv_blocks=16, max_model_len=256, watermark=0.0, block_size=16)
    if variant == "no_prefix_cache":
        kw["enable_prefix_caching"] = False
    if variant == "fast_decode":
        kw["fast_decode"] = True   # verify steps through the native forward
    return EngineConfig.from_settings(**kw)


def draft_blocks_used(engine: LLMEngine) -> int:
    return getattr(engine.speculator.proposer, "num_used_blocks", 0)


@pytest.mark.parametrize("method, k, adaptive, variant", CASES)
def test_speculative_greedy_matches_hf(setup, method, k, adaptive, variant):
    folder, draft, prompts, expected = setup
    engine = LLMEngine(engine_config(folder, draft, method, k, adaptive, variant))
    burst = variant == "preemption"                 # one burst: the small pool runs out on any machine
    if not burst:
        engine.start()
    try:
        check_greedy_matches(engine, prompts, expected, NEW_TOKENS, stagger=not burst)
        spec = engine.scheduler.spec_counters
        assert spec.num_draft_tokens > 0, "speculation never ran"
        if not adaptive:    # adaptive rightly stops proposing where its first drafts show they do not pay
            assert spec.num_accepted_tokens > 0, "no draft was ever accepted"
        assert max(spec.accepted_per_pos and [len(spec.accepted_per_pos)]) <= k
        stats = engine.stats()
        assert stats.kv_blocks_used == 0 and draft_blocks_used(engine) == 0, "blocks leaked"
        if variant == "preemption":
            assert stats.num_preemptions > 0
    finally:
        engine.shutdown()


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_abort_in_the_middle_of_speculation_frees_every_block(setup, method):
    folder, draft, prompts, _ = setup
    engine = LLMEngine(engine_config(folder, draft, method, 4, False, "plain")).start()
    try:
        done = threading.Semaphore(0)
        finals = {}

        def cb(out):
            if out.request_finished:
                finals[out.request_id] = out
                done.release()
        params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
        for i, p in enumerate(prompts[:6]):
            engine.add_request(f"a{i}", p, params, cb)
        deadline = time.monotonic() + 60
        while engine.scheduler.spec_counters.num_draft_tokens == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        for i in range(6):
            engine.abort(f"a{i}")
        for _ in range(6):
            assert done.acquire(timeout=60)
        assert all(o.finish_reason in (FinishReason.ABORT, FinishReason.LENGTH) for o in finals.values())
        deadline = time.monotonic() + 10
        while (engine.stats().kv_blocks_used or draft_blocks_used(engine)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.stats().kv_blocks_used == 0 and draft_blocks_used(engine) == 0
        assert engine.runner.sampler.num_drawn_seeds == 0
    finally:
        engine.shutdown()


def test_request_can_lower_k_or_turn_speculation_off(setup):
    folder, draft, prompts, expected = setup
    engine = LLMEngine(engine_config(folder, draft, "ngram", 4, False, "plain"))
    off = SamplingParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=0.0, num_speculative_tokens=0)
    outs = engine.generate(prompts[:4], off)
    assert [output_token_ids(o) for o in outs] == expected[:4]
    assert engine.scheduler.spec_counters.num_draft_tokens == 0
    two = SamplingParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=0.0, num_speculative_tokens=2)
    outs = engine.generate(prompts[:4], two)
    assert [output_token_ids(o) for o in outs] == expected[:4]
    assert 0 < len(engine.scheduler.spec_counters.accepted_per_pos) <= 2
    with pytest.raises(ValueError, match="^num_speculative_tokens"):
        engine.add_request("x", prompts[0], SamplingParams(num_speculative_tokens=5), lambda o: None)
