"""Oracle for the families beside Llama / Mistral / Qwen2 (Qwen3: q/k norms; Phi-3 / Phi-4-mini: fused
checkpoint projections, LongRoPE on part of each head): random checkpoints written by transformers' own config
classes, served by the engine on the eager path and on the native step, greedy outputs equal transformers'
``generate`` token for token on unseen prompts, under concurrency, chunked prefill, n-gram speculation and forced
preemption; every KV block comes back."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from tests.backend.engine.test_engine_oracle import check_family_variant
from tests.helpers.families import FAMILIES, make_family_checkpoint
from tests.helpers.oracle import hf_greedy, repeating_prompts

NEW_TOKENS = 24
VARIANTS = {
    "eager": {"fast_decode": False},
    "eager_ngram_chunked": {"fast_decode": False, "speculative_method": "ngram", "num_speculative_tokens": 3,
                            "speculative_adaptive": False, "max_num_batched_tokens": 16},
    "native": {"fast_decode": True},
    "native_ngram": {"fast_decode": True, "speculative_method": "ngram", "num_speculative_tokens": 4,
                     "speculative_adaptive": False},
    "native_preemption": {"fast_decode": True, "num_kv_blocks": 10, "max_model_len": 128, "watermark": 0.0, "block_size": 16,
                          "speculative_method": "ngram", "num_speculative_tokens": 2},
}


@pytest.fixture(scope="module", params=sorted(set(FAMILIES) - {"gemma3"}))   # Gemma 3's: test_gemma3_oracle.py
def setup(request, tmp_path_factory):
    folder = make_family_checkpoint(tmp_path_factory.mktemp(request.param) / "ckpt", request.param)
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    prompts = repeating_prompts(7, 10, stem_len=20, span_range=(6, 14), gap_range=(4, 20))
    expected = [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]
    return request.param, folder, prompts, expected


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_matches_hf(setup, variant):
    name, folder, prompts, expected = setup
    check_family_variant(folder, variant, VARIANTS[variant], prompts, expected, NEW_TOKENS, f"{name}/{variant}: ")


def test_longrope_context_is_the_original_one(tmp_path):
    """LongRoPE is served up to original_max_position_embeddings (transformers' own output past it depends on
    how generation was chunked): the default context, and a longer max_model_len is refused by name."""
    folder = make_family_checkpoint(tmp_path / "ckpt", "phi4_partial")    # partial rotary with LongRoPE
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(folder), kv_cache_bytes=4 << 20, device="cpu"))
    try:
        assert engine.scheduler.max_model_len == 128
    finally:
        engine.shutdown()
    with pytest.raises(ValueError, match="max_model_len: 256 exceeds 128.*original_max_position_embeddings"):
        LLMEngine(EngineConfig.from_settings(model_path=str(folder), kv_cache_bytes=4 << 20, device="cpu",
                                             max_model_len=256))

