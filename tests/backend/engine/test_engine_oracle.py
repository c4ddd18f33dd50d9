"""Oracle for the paged engine: greedy outputs equal HF transformers' per-request greedy outputs,
token for token, under concurrency with staggered arrival, chunked prefill, prefix-cache hits
and preemption. Afterwards every KV block is free again."""
from __future__ import annotations

import random
import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from backend.config import EngineConfig
from backend.core.outputs import FinishReason
from backend.engine.llm_engine import LLMEngine, output_token_ids
from backend.engine.native_decode import NativeDecodeStep
from contracts.sampling_params import SamplingParams
from tests.helpers.oracle import assert_same_tokens, hf_greedy

NUM_REQUESTS = 16
NEW_TOKENS = 24


def make_prompts(seed: int, vocab: int = 4000) -> list[list[int]]:
    """16 prompts of 3..70 tokens; half share a 40-token stem (prefix-cache hits)."""
    rng = random.Random(seed)
    stem = [rng.randrange(7, vocab) for _ in range(40)]
    prompts = []
    for i in range(NUM_REQUESTS):
        tail = [rng.randrange(7, vocab) for _ in range(rng.randint(3, 30))]
        prompts.append([0] + (stem + tail if i % 2 else tail))
    return prompts


@pytest.fixture(scope="module", params=["tiny", "demo"])
def setup(request, tiny_checkpoint):
    folder = tiny_checkpoint if request.param == "tiny" else request.getfixturevalue("demo_target")
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    prompts = make_prompts(seed=1)
    expected = [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]
    return folder, prompts, expected


def run_staggered(engine: LLMEngine, prompts, params, stagger: bool = True) -> list[list]:
    """Submit with small random gaps while the loop thread runs, so requests join mid-flight.
    ``stagger=False``: submit all before the loop starts (a deterministic burst, e.g. to force preemption)."""
    rng = random.Random(0)
    results = [[] for _ in prompts]
    done = threading.Semaphore(0)
    for i, p in enumerate(prompts):
        def cb(out, i=i):
            results[i].append(out)
            if out.request_finished:
                done.release()
        engine.add_request(f"r{i}", p, params, cb)
        if stagger:
            time.sleep(rng.random() * 0.01)
    engine.start()   # a no-op when the loop already runs
    for _ in prompts:
        assert done.acquire(timeout=300), "a request never finished"
    return results


def check_greedy_matches(engine: LLMEngine, prompts, expected, new_tokens: int, what: str = "",
                         stagger: bool = True) -> None:
    """Run every prompt greedy (EOS masked, as HF's min_new_tokens) with staggered arrivals; each output
    equals ``expected`` token for token and ends once, with ``length``."""
    params = SamplingParams(max_tokens=new_tokens, min_tokens=new_tokens, temperature=0.0)
    for i, outs in enumerate(run_staggered(engine, prompts, params, stagger)):
        assert_same_tokens(output_token_ids(outs), expected[i], f"{what}request {i}")
        assert outs[-1].request_finished and outs[-1].finish_reason is FinishReason.LENGTH
        assert sum(o.request_finished for o in outs) == 1


def check_variant_matches(engine: LLMEngine, prompts, expected, new_tokens: int, what: str, *, burst: bool,
                          speculative: bool) -> None:
    """``check_greedy_matches`` on the running loop with staggered arrivals, or (``burst``: a small pool that
    must preempt on any machine) as one burst stepped here; then every block free, drafts accepted when
    ``speculative``, a preemption in a burst. The engine is shut down."""
    if not burst:
        engine.start()
    try:
        check_greedy_matches(engine, prompts, expected, new_tokens, what, stagger=not burst)
        stats = engine.stats()
        assert stats.kv_blocks_used == 0, "blocks leaked"
        if speculative:
            assert stats.spec.num_accepted_tokens > 0, "speculation should have accepted drafts"
        if burst:
            assert stats.num_preemptions > 0
    finally:
        engine.shutdown()


def check_family_variant(folder, variant: str, settings: dict, prompts, expected, new_tokens: int, what: str) -> None:
    """An engine on ``folder`` with a variant's ``settings`` (``native*``: the native step; ``*preemption``: one
    burst on a small pool; ``*ngram*``: drafts accepted) through ``check_variant_matches``."""
    kw = dict(model_path=str(folder), max_num_seqs=16, kv_cache_bytes=16 << 20, device="cpu", **settings)
    engine = LLMEngine(EngineConfig.from_settings(**kw))
    assert isinstance(engine.runner.fast_decode, NativeDecodeStep) == variant.startswith("native")
    check_variant_matches(engine, prompts, expected, new_tokens, what, burst=variant.endswith("preemption"),
                          speculative="ngram" in variant)


@pytest.mark.parametrize("variant", ["plain", "chunked_prefill", "preemption", "no_prefix_cache",
                                     "fast_decode_preemption"])
def test_greedy_matches_hf_under_concurrency(setup, variant):
    folder, prompts, expected = setup
    kw = dict(model_path=str(folder), max_num_seqs=16, kv_cache_bytes=32 << 20)
    if variant == "chunked_prefill":
        kw["max_num_batched_tokens"] = 8    # every prompt is prefilled in several chunks
    if variant.endswith("preemption"):
        kw.update(num_kv_blocks=20, max_model_len=256, watermark=0.0, block_size=16)
    if variant.startswith("fast_decode"):
        kw["fast_decode"] = True       # decode steps through the native forward (backend/engine/native_decode.py)
    if variant == "no_prefix_cache":
        kw["enable_prefix_caching"] = False
    engine = LLMEngine(EngineConfig.from_settings(**kw))
    if not variant.endswith("preemption"):
        engine.start()
    try:
        # preemption: one burst, so the small pool runs out however fast this machine decodes
        check_greedy_matches(engine, prompts, expected, NEW_TOKENS, stagger=not variant.endswith("preemption"))
        stats = engine.stats()
        assert stats.kv_blocks_used == 0, "blocks leaked"
        if variant.endswith("preemption"):
            assert stats.num_preemptions > 0, "the pool was meant to be small enough to force preemption"
        if variant in ("plain", "chunked_prefill"):
            assert stats.prefix_cache_hits > 0, "shared stems should hit the prefix cache"
    finally:
        engine.shutdown()
