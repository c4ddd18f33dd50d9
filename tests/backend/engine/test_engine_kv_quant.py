"""The engine with an int8 KV cache (``kv_cache_dtype``): capacity, greedy agreement with the unquantized
cache under concurrency, preemption and speculation (rollback), no leaked block, the prefix-cache key, the
load line and configuration errors."""
from __future__ import annotations

import pytest

from backend.config import EngineConfig
from backend.engine.builder import build_engine_parts
from backend.engine.llm_engine import LLMEngine, output_token_ids
from contracts.sampling_params import SamplingParams
from tests.backend.engine.test_engine_oracle import NEW_TOKENS, make_prompts, run_staggered

PARAMS = SamplingParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=0.0)


def identical_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run(folder, prompts, stagger=True, **kw) -> tuple[list[list[int]], object]:
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(folder), max_num_seqs=16, kv_cache_bytes=8 << 20,
                                                  **kw))
    if stagger:
        engine.start()
    try:
        outs = [output_token_ids(o) for o in run_staggered(engine, prompts, PARAMS, stagger)]
        stats = engine.stats()
        assert stats.kv_blocks_used == 0, "blocks leaked"
        return outs, stats
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def reference(demo_target):
    prompts = make_prompts(seed=3)
    exact, stats = run(demo_target, prompts)
    return prompts, exact, stats


def assert_agrees(got, exact, what):
    first = sum(g[0] == e[0] for g, e in zip(got, exact)) / len(exact)
    prefix = sum(identical_prefix(g, e) for g, e in zip(got, exact)) / len(exact)
    assert first >= 0.9 and prefix >= 0.6 * NEW_TOKENS, f"{what}: first-token {first:.2f}, mean prefix {prefix:.1f}"


@pytest.mark.parametrize("variant", ["plain", "preemption", "ngram_speculation", "chunked_prefill"])
def test_int8_kv_agrees_with_exact_kv_and_frees_every_block(demo_target, reference, variant):
    prompts, exact, exact_stats = reference
    kw = {"kv_cache_dtype": "int8"}
    if variant == "preemption":
        kw.update(num_kv_blocks=20, max_model_len=256, watermark=0.0)
    if variant == "ngram_speculation":
        kw.update(speculative_method="ngram", num_speculative_tokens=3)   # rejected drafts roll the KV back
    if variant == "chunked_prefill":
        kw["max_num_batched_tokens"] = 8
    got, stats = run(demo_target, prompts, stagger=variant != "preemption", **kw)
    assert_agrees(got, exact, variant)
    if variant == "plain":
        assert stats.kv_blocks_max >= 3.5 * exact_stats.kv_blocks_max    # same kv_cache_bytes
        assert stats.prefix_cache_hits > 0                              # shared stems hit quantized blocks
    if variant == "preemption":
        assert stats.num_preemptions > 0


def test_prefix_cache_key_and_load_line_name_the_kv_dtype(tiny_checkpoint):
    parts = {kv: build_engine_parts(EngineConfig.from_settings(model_path=str(tiny_checkpoint), device="cpu",
                                                               num_kv_blocks=100,
                                                               kv_cache_dtype=kv)) for kv in ("auto", "int8")}
    keys = {kv: p.scheduler.block_manager.extra_key for kv, p in parts.items()}
    assert keys["auto"] != keys["int8"]
    s = parts["int8"].summary
    assert "weights quantization none; KV cache int8 (+ an fp16 scale per token and head)" in s, s
    # tiny: 2 layers x 2 KV heads x (16 int8 + 2 bytes of scale) x (K, V) = 144 bytes per token
    assert "144 bytes per token" in s, s
    assert "KV cache auto (float32)" in parts["auto"].summary
    assert parts["int8"].formats.labels() == {"quantization": "none", "kv_cache_dtype": "int8", "dtype": "float32"}
    assert parts["int8"].runner.kv_cache.format.name == "int8"


def test_bad_kv_cache_dtype_is_a_load_error_naming_it(tiny_checkpoint):
    with pytest.raises(ValueError, match="kv_cache_dtype: expected one of"):
        EngineConfig.from_settings(model_path=str(tiny_checkpoint), kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="kv_cache_dtype: expected one of"):
        EngineConfig.from_parameters({"model_path": str(tiny_checkpoint), "kv_cache_dtype": "float8"})
    assert EngineConfig.from_parameters({"model_path": "m", "kv_cache_dtype": {"string_value": "int8"}}) \
        .cache.kv_cache_dtype == "int8"
    with pytest.raises(ValueError, match="kv_cache_dtype: fp8 needs a CUDA device"):
        build_engine_parts(EngineConfig.from_settings(model_path=str(tiny_checkpoint), device="cpu",
                                                      kv_cache_dtype="fp8"))


def test_int8_kv_with_a_sliding_window_frees_blocks_behind_it(tmp_path):
    """Every layer windowed (Mistral, window 16): blocks behind the window are freed while int8 sequences run;
    the outputs agree with the exact cache's and no block is left."""
    from tests.backend.engine.test_sliding_window_oracle import MODELS, make_prompts, small_biases
    from tests.helpers.checkpoints import make_random_checkpoint
    folder = make_random_checkpoint(tmp_path / "mistral", extra=MODELS["mistral"], max_pos=512)
    small_biases(folder)
    prompts = make_prompts(seed=4)
    exact, _ = run(folder, prompts, max_num_batched_tokens=32)
    got, _ = run(folder, prompts, max_num_batched_tokens=32, kv_cache_dtype="int8")
    assert_agrees(got, exact, "sliding window")


def test_the_fast_decode_step_leaves_a_quantized_cache_to_the_attention_backend(tiny_checkpoint):
    """The native fused decode step reads fp32 K/V itself: with an int8 cache it stays off, saying why."""
    parts = build_engine_parts(EngineConfig.from_settings(model_path=str(tiny_checkpoint), device="cpu",
                                                          num_kv_blocks=100,
                                                          kv_cache_dtype="int8", fast_decode=True))
    assert parts.runner.fast_decode is None
    assert "fast decode off (an int8 KV cache (kv_cache_dtype) runs eagerly)" in parts.summary, parts.summary
