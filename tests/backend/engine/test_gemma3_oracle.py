"""Oracle for Gemma 3 text served by the engine: random checkpoints written by transformers' Gemma3TextConfig, prompts
longer than the sliding window, greedy outputs equal transformers' ``generate`` token for token, on the eager path
and on the native step, under concurrency, chunked prefill, n-gram speculation and forced preemption; every KV block
comes back. One checkpoint mixes sliding and full layers (soft-capped logits, a query scale of its own); in the other
every layer slides, so the blocks behind the window are freed while sequences run."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.backend.engine.test_engine_oracle import check_family_variant
from tests.helpers.checkpoints import make_hf_checkpoint
from tests.helpers.oracle import hf_greedy, repeating_prompts

NEW_TOKENS = 24
WINDOW = 16
GEMMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, max_position_embeddings=256, sliding_window=WINDOW, query_pre_attn_scalar=24,
             tie_word_embeddings=True)
CHECKPOINTS = {
    "mixed": dict(GEMMA, sliding_window_pattern=2, final_logit_softcapping=10.0),   # layers 0, 2 slide
    "every_layer": dict(GEMMA, layer_types=["sliding_attention"] * 3, rope_local_base_freq=500.0),
}
VARIANTS = {
    "eager": {"fast_decode": False},
    "eager_ngram_chunked": {"fast_decode": False, "speculative_method": "ngram", "num_speculative_tokens": 3,
                            "speculative_adaptive": False, "max_num_batched_tokens": 16},
    "native": {"fast_decode": True},
    "native_ngram_chunked": {"fast_decode": True, "speculative_method": "ngram", "num_speculative_tokens": 4,
                             "speculative_adaptive": False, "max_num_batched_tokens": 24},
    "native_preemption": {"fast_decode": True, "num_kv_blocks": 8, "max_model_len": 128, "watermark": 0.0,
                          "block_size": 16, "max_num_batched_tokens": 16, "speculative_method": "ngram",
                          "num_speculative_tokens": 2},
}


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def setup(request, tmp_path_factory):
    folder = make_hf_checkpoint(tmp_path_factory.mktemp(request.param) / "ckpt", "Gemma3TextConfig", seed=4,
                                **CHECKPOINTS[request.param])
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    prompts = repeating_prompts(7, 10, stem_len=20, span_range=(6, 14), gap_range=(8, 20), gap_always=True)
    assert all(len(p) > WINDOW for p in prompts)
    expected = [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]
    unwindowed = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, sliding_window=10_000).eval()
    differs = sum(hf_greedy(unwindowed, p, NEW_TOKENS) != e for p, e in zip(prompts, expected))
    assert differs >= len(prompts) // 2, "the window should change most outputs, or this test proves nothing"
    return request.param, folder, prompts, expected


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_matches_hf(setup, variant):
    name, folder, prompts, expected = setup
    check_family_variant(folder, variant, VARIANTS[variant], prompts, expected, NEW_TOKENS, f"gemma3 {name}/{variant}: ")
