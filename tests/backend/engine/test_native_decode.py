"""The native decode forward (backend/native/csrc/decode_forward.cpp) against the eager model.

Sequences with cached contexts crossing block boundaries compute 1 (decode) or k + 1 (verify) new
tokens, or prefill chunks (with ``logit_rows``: only the sampled tokens' logits, only those tokens
through the last layer past its K/V write); the native op's logits and the K/V it writes must equal
the eager forward's (tolerance: a different summation order), for GQA and MHA, tied and untied heads,
biased projections, q/k norms with o_proj biases (Qwen3), partial LongRoPE (Phi-4-mini's layout), Gemma 3's blocks
(1 + w norms, four a layer, GELU-tanh, the embedding scale, query_pre_attn_scalar, a second RoPE table for its
sliding layers, final logit soft-capping), and sliding
windows (per layer, contexts longer than the window, the blocks before every window freed as the scheduler does).
"""
from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from backend.attention.metadata import build_attention_metadata
from backend.attention.torch_paged import TorchPagedAttention
from backend.core.kv_cache import KVCache
from backend.engine.native_decode import NativeDecodeStep, unsupported_reason
from backend.model.config import ModelConfig
from backend.model.llama import LlamaForCausalLM
from tests.helpers.paged_reference import random_layout

BLOCK = 4
NUM_BLOCKS = 160


@pytest.fixture(scope="module")
def ops(native_lib):
    return native_lib


# families beside Llama / Qwen2: their config.json fields (q/k norms and o_proj biases; partial LongRoPE)
FAMILY_FIELDS = {
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "head_dim": 16, "attention_bias": True},
    "phi3": {"architectures": ["Phi3ForCausalLM"], "partial_rotary_factor": 0.75, "max_position_embeddings": 512,
             "original_max_position_embeddings": 256,
             "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0, 1.3, 1.7, 2.0, 3.1, 5.0],
                              "long_factor": [4.0] * 6}},
    # layer 0 slides (its own RoPE base, rope_local_base_freq), layer 1 is full; q/k/v/o biases, soft-capped logits
    "gemma3": {"architectures": ["Gemma3ForCausalLM"], "head_dim": 16, "query_pre_attn_scalar": 20,
               "sliding_window": 6, "sliding_window_pattern": 2, "rope_local_base_freq": 300.0,
               "final_logit_softcapping": 4.0, "attention_bias": True},
}


def make_model(heads: int, kv_heads: int, tie: bool, bias: bool, family: str = "", seed: int = 0) -> LlamaForCausalLM:
    """``bias``: a Qwen2 layout (q/k/v biases) with Llama's optional MLP biases as well; ``family``: one of
    ``FAMILY_FIELDS`` instead."""
    cfg = ModelConfig.from_dict({
        "architectures": ["Qwen2ForCausalLM" if bias else "LlamaForCausalLM"],
        "model_type": "qwen2" if bias else "llama", "vocab_size": 300, "hidden_size": 48,
        "intermediate_size": 80, "num_hidden_layers": 2, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": tie,
        "torch_dtype": "float32", **FAMILY_FIELDS.get(family, {})})
    torch.manual_seed(seed)
    if bias:
        cfg = dataclasses.replace(cfg, mlp_bias=True)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1) if p.dim() == 2 else p.uniform_(0.5, 1.5)
    return model


@torch.inference_mode()
def eager_step(model, cache, tables, computed, new, token_ids, windows=None):
    """The eager path's logits for every new token (prefills the contexts when ``computed`` is 0)."""
    attn = TorchPagedAttention(cache, scale=model.config.query_scale, windows=windows)
    meta = build_attention_metadata(computed, new, tables, BLOCK)
    attn.prepare(meta)
    return model.compute_logits(model(token_ids, meta.positions, attn))


def prefilled_case(model, ctx_lens, query_lens, seed, windows=None):
    """A KV cache holding each sequence's context, the block tables, and the step's new tokens."""
    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    cache = KVCache(cfg.num_hidden_layers, NUM_BLOCKS, BLOCK, cfg.num_key_value_heads, cfg.head_dim)
    tables = random_layout(ctx_lens, query_lens, BLOCK, NUM_BLOCKS, gen)
    ctx_tokens = torch.randint(0, cfg.vocab_size, (sum(ctx_lens),), generator=gen)
    cached = [(t, c) for t, c in zip(tables, ctx_lens) if c]   # a sequence with no context has nothing to write
    if cached:
        eager_step(model, cache, [t for t, _ in cached], [0] * len(cached), [c for _, c in cached], ctx_tokens,
                   windows)
    new_tokens = torch.randint(0, cfg.vocab_size, (sum(query_lens),), generator=gen)
    return cache, tables, new_tokens


@torch.inference_mode()
def native_step(ops, model, cache, tables, ctx_lens, query_lens, token_ids, logit_rows=None, windows=None):
    step = NativeDecodeStep(ops, model, cache, scale=None, windows=windows)
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    positions = torch.cat([torch.arange(c, c + q) for c, q in zip(ctx_lens, query_lens)])
    rows = torch.cat([torch.full((q,), i, dtype=torch.int32) for i, q in enumerate(query_lens)])
    return step.forward(token_ids, positions, rows, block_tables, logit_rows)


# head_dim 8, 12, 6: the attention's per-token path; 16 (G = 3) and 48 (MHA): its tiled path (paged_attention.cpp)
# qwen3: q/k norms, q/k/v/o biases (head_dim 16); phi3: LongRoPE on 12 of 16 dims
MODELS = {"gqa_tied": (6, 2, True, False), "mha_untied": (4, 4, False, False), "gqa_bias": (8, 2, True, True),
          "gqa_hd16": (3, 1, True, False), "mha_hd48_bias": (1, 1, False, True),
          "qwen3_hd16": (4, 2, False, False, "qwen3"), "phi3_partial": (3, 1, True, False, "phi3"),
          "gemma3_hd16": (4, 2, False, False, "gemma3")}


@pytest.mark.parametrize("model_kind", sorted(MODELS))
@pytest.mark.parametrize("ctx_lens, query_lens", [
    ([7], [1]),                               # batch 1 decode; the new token starts block 2
    ([3, 8, 15, 1], [1, 1, 1, 1]),            # decodes crossing and ending on block boundaries
    ([9, 4], [5, 3]),                         # verify steps (k = 4 and k = 2 drafts) across blocks
    ([30, 2, 11, 16, 5, 40, 7, 12, 3], [1, 5, 1, 3, 1, 5, 2, 1, 1]),   # 20 tokens: short rows, the GEMV
    ([30, 2, 11, 16, 5, 40, 7, 12], [2, 1, 1, 2, 1, 2, 1, 2]),           # 12 tokens: the GEMV, 8 at a time
    ([6 + i for i in range(14)], [5] * 14),                             # 70 tokens: the GEMM path (> 64)
])
def test_native_forward_matches_eager(ops, model_kind, ctx_lens, query_lens):
    model = make_model(*MODELS[model_kind])
    cache, tables, tokens = prefilled_case(model, ctx_lens, query_lens, seed=len(ctx_lens))
    eager_cache = KVCache(cache.num_layers, NUM_BLOCKS, BLOCK, cache.num_kv_heads, cache.head_dim)
    eager_cache.data.copy_(cache.data)
    expected = eager_step(model, eager_cache, tables, ctx_lens, query_lens, tokens)
    got = native_step(ops, model, cache, tables, ctx_lens, query_lens, tokens)
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    torch.testing.assert_close(cache.data, eager_cache.data, atol=1e-5, rtol=1e-5)   # the same K/V written


@pytest.mark.parametrize("model_kind", ["gqa_tied", "gqa_bias", "mha_hd48_bias", "qwen3_hd16", "phi3_partial",
                                        "gemma3_hd16"])
@pytest.mark.parametrize("ctx_lens, query_lens, picks", [
    ([0], [37], [36]),                        # a whole prompt, its last token sampled
    ([0, 9, 5], [70, 1, 5], [69, 70, 72, 73, 74, 75]),   # a prefill chunk beside a decode and a verify (k = 3)
    ([12, 0], [20, 3], [22]),                 # a chunk that does not sample (mid-prompt), then a short prompt
    ([0], [5], [0, 1, 2, 3, 4]),              # every token: no gather past the last K/V write
])
def test_prefill_chunks_return_the_sampled_rows(ops, model_kind, ctx_lens, query_lens, picks):
    model = make_model(*MODELS[model_kind])
    cache, tables, tokens = prefilled_case(model, ctx_lens, query_lens, seed=len(picks))
    eager_cache = KVCache(cache.num_layers, NUM_BLOCKS, BLOCK, cache.num_kv_heads, cache.head_dim)
    eager_cache.data.copy_(cache.data)
    expected = eager_step(model, eager_cache, tables, ctx_lens, query_lens, tokens)[picks]
    got = native_step(ops, model, cache, tables, ctx_lens, query_lens, tokens, torch.tensor(picks))
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(cache.data, eager_cache.data, atol=1e-5, rtol=1e-5)   # every token's K/V, all layers


# per layer: every layer windowed (blocks behind the window freed), or one full-attention layer beside a windowed one
WINDOWS = {"every_layer": (6, 6), "mixed": (None, 9)}


@pytest.mark.parametrize("windows", sorted(WINDOWS))
@pytest.mark.parametrize("model_kind", ["gqa_tied", "gqa_hd16", "mha_hd48_bias", "qwen3_hd16", "gemma3_hd16"])
@pytest.mark.parametrize("ctx_lens, query_lens, picks", [
    ([7, 20, 33, 12], [1, 1, 1, 1], None),                # decodes, contexts past the window
    ([9, 30], [5, 3], None),                              # verify steps whose windows start in different blocks
    ([0, 25, 14], [40, 1, 4], [39, 40, 41, 42, 43, 44]),  # a whole prompt beside a decode and a verify
    ([17, 0], [20, 3], [22]),                             # a chunk that does not sample, then a short prompt
])
def test_sliding_windows_match_eager(ops, windows, model_kind, ctx_lens, query_lens, picks):
    """Prompts and contexts longer than the window: the native op's logits and K/V equal the eager path's (the torch
    backend's windowed masks). With every layer windowed, the blocks wholly before each row's window are freed as
    the scheduler does (NULL_BLOCK in the table, junk in the old blocks): the native op never reads them."""
    wins = WINDOWS[windows]
    model = make_model(*MODELS[model_kind])
    cache, tables, tokens = prefilled_case(model, ctx_lens, query_lens, seed=len(ctx_lens), windows=wins)
    if all(wins):
        for table, ctx in zip(tables, ctx_lens):
            for b in range(max(0, ctx - wins[0] + 1) // BLOCK):
                cache.data[:, :, table[b]] = 1e3         # junk: read, it would show
                table[b] = -1                             # NULL_BLOCK
    eager_cache = KVCache(cache.num_layers, NUM_BLOCKS, BLOCK, cache.num_kv_heads, cache.head_dim)
    eager_cache.data.copy_(cache.data)
    expected = eager_step(model, eager_cache, tables, ctx_lens, query_lens, tokens, wins)
    expected = expected if picks is None else expected[picks]
    got = native_step(ops, model, cache, tables, ctx_lens, query_lens, tokens,
                      None if picks is None else torch.tensor(picks), wins)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(cache.data, eager_cache.data, atol=1e-5, rtol=1e-5)
    positions = torch.cat([torch.arange(c, c + q) for c, q in zip(ctx_lens, query_lens)])
    binding = int((positions if picks is None else positions[picks]).max()) >= 9
    if not all(wins) and binding:                         # the window changes these logits: the test can fail
        unwindowed = native_step(ops, model, eager_cache, tables, ctx_lens, query_lens, tokens,
                                 None if picks is None else torch.tensor(picks))
        assert not torch.allclose(unwindowed, expected, atol=1e-3)


@pytest.mark.parametrize("picks", [[], [3, 2], [0, 0], [-1], [9]])
def test_bad_logit_rows_are_refused(ops, picks):
    model = make_model(6, 2, True, False)
    cache, tables, tokens = prefilled_case(model, [0], [9], seed=0)
    with pytest.raises(RuntimeError, match="logit_rows"):
        native_step(ops, model, cache, tables, [0], [9], tokens, torch.tensor(picks, dtype=torch.int64))


def _plan(computed: int, new: int, total: int):
    seq = SimpleNamespace(num_computed_tokens=computed, num_tokens=total)
    return SimpleNamespace(scheduled=[SimpleNamespace(seq=seq, sample=True, num_new_tokens=new, num_draft_tokens=0)],
                           num_batched_tokens=new)


@pytest.mark.parametrize("model_kind, prefills", [("gqa_hd16", True), ("mha_hd48_bias", True), ("gqa_tied", False)])
def test_prefill_goes_native_only_where_the_attention_is_tiled(ops, model_kind, prefills):
    model = make_model(*MODELS[model_kind])
    cfg = model.config
    step = NativeDecodeStep(ops, model, KVCache(2, 8, BLOCK, cfg.num_key_value_heads, cfg.head_dim), scale=None)
    assert step.prefills is prefills
    assert step.accepts(_plan(7, 1, 8))                     # a decode step: always
    assert step.accepts(_plan(0, 8, 8)) is prefills         # a prompt
    assert step.accepts(_plan(4, 3, 9)) is prefills         # a chunk that does not reach the end


def test_unsupported_models_stay_eager():
    model = make_model(6, 2, True, False)
    cache = KVCache(2, 8, BLOCK, 2, 8)
    assert unsupported_reason(model, cache, (None, None), None) is None
    assert unsupported_reason(model, cache, (None, 16), None) is None        # sliding windows run natively
    int8_kv = KVCache(2, 8, BLOCK, 2, 8, kv_cache_dtype="int8")
    assert "KV cache" in unsupported_reason(model, int8_kv, (None, None), None)
    half = KVCache(2, 8, BLOCK, 2, 8, dtype=torch.bfloat16)
    assert "float32" in unsupported_reason(model, half, (None, None), None)
    from backend.model.quant import quantize_model
    quantize_model(model, "int8", 128)
    assert "quantized" in unsupported_reason(model, cache, (None, None), None)


def test_scale_defaults_to_inverse_sqrt_head_dim(ops):
    model = make_model(6, 2, True, False)
    step = NativeDecodeStep(ops, model, KVCache(2, 8, BLOCK, 2, 8), scale=None)
    assert step.scale == pytest.approx(1 / math.sqrt(8))
