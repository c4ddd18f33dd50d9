"""The native decode forward (decode_forward.cpp) of int8 / int4 models: every projection and the int8 LM head through
the quantized GEMM's strips, against the eager model (whose QuantLinear runs the same GEMM), at decode, verify and
prefill sizes; the models the op cannot take stay eager."""
from __future__ import annotations

import pytest
import torch

from backend.core.kv_cache import KVCache
from backend.engine.native_decode import NativeDecodeStep, unsupported_reason
from backend.model.config import ModelConfig
from backend.model.llama import LlamaForCausalLM
from backend.model.quant import quantize_model
from tests.backend.engine.test_native_decode import BLOCK, NUM_BLOCKS, eager_step, native_step, prefilled_case


@pytest.fixture(scope="module")
def ops(native_lib):
    if not hasattr(native_lib, "quant_gemm"):
        pytest.skip("the native library has no quant_gemm op")
    return native_lib


def quantized_model(mode: str, group: int, tie: bool = True) -> LlamaForCausalLM:
    cfg = ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 300, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": tie,
        "torch_dtype": "float32"})
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1) if p.dim() == 2 else p.uniform_(0.5, 1.5)
    quantize_model(model, mode, group)
    return model


@pytest.mark.parametrize("mode,group,tie", [("int8", 0, True), ("int4", 32, False), ("int4", 64, True)])
@pytest.mark.parametrize("ctx_lens, query_lens, picks", [
    ([7], [1], None),                                     # batch 1 decode
    ([3, 8, 15, 1, 9], [1, 1, 1, 1, 5], None),            # decodes and a verify (k = 4)
    ([6 + i for i in range(14)], [5] * 14, None),         # 70 tokens
    ([0, 9], [37, 1], [36, 37]),                          # a prefill chunk beside a decode
])
def test_quantized_native_forward_matches_eager(ops, mode, group, tie, ctx_lens, query_lens, picks):
    model = quantized_model(mode, group, tie)
    assert unsupported_reason(model, KVCache(2, 8, BLOCK, 2, 16), (None, None), None) is None
    cache, tables, tokens = prefilled_case(model, ctx_lens, query_lens, seed=len(ctx_lens))
    eager_cache = KVCache(cache.num_layers, NUM_BLOCKS, BLOCK, cache.num_kv_heads, cache.head_dim)
    eager_cache.data.copy_(cache.data)
    expected = eager_step(model, eager_cache, tables, ctx_lens, query_lens, tokens)
    rows = None if picks is None else torch.tensor(picks)
    got = native_step(ops, model, cache, tables, ctx_lens, query_lens, tokens, rows)
    expected = expected if picks is None else expected[picks]
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(cache.data, eager_cache.data, atol=1e-5, rtol=1e-5)


def test_op_is_given_strips_not_panels(ops):
    model = quantized_model("int4", 32)
    step = NativeDecodeStep(ops, model, KVCache(2, 8, BLOCK, 2, 16), scale=None)
    w = step.weights
    assert len(w.layer_quant) == 2 * 4 * 3 and len(w.lm_head_quant) == 3
    assert all(p.numel() == 0 for p in w.layer_panels) and w.lm_head_panels.numel() == 0
    assert w.layer_quant[0].dtype == torch.uint8 and w.lm_head_quant[0].dtype == torch.int8   # int4 layers, int8 head


def test_layers_without_strips_stay_eager():
    model = quantized_model("int4", 16)          # groups of 16 columns: not whole activation blocks
    assert "strips" in unsupported_reason(model, KVCache(2, 8, BLOCK, 2, 16), (None, None), None)


def test_strips_move_to_huge_pages_and_compute_the_same(ops, monkeypatch):
    """``strips_to_huge_pages``: int8 / uint8 / int32 / float strips side by side in one arena (each at a multiple of
    its element size), the layers then reading the copies with unchanged results."""
    from backend.engine import huge_pages, native_decode
    monkeypatch.setattr(huge_pages, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(huge_pages, "_madvise_huge", lambda start, length: True)
    monkeypatch.setattr(native_decode, "MIN_PANEL_HUGE_PAGE_BYTES", 0)
    model = quantized_model("int4", 32)
    lin = model.layers[0].mlp.down_proj
    x = torch.randn(3, lin.in_features)
    before, old = lin.forward(x), lin.strips.strips
    assert native_decode.strips_to_huge_pages(model)
    assert lin.strips.strips.data_ptr() != old.data_ptr() and torch.equal(lin.strips.strips, old)
    assert torch.equal(lin.forward(x), before)
    head = model.lm_head.strips
    assert head.aux.dtype == torch.int32 and head.aux.data_ptr() % 4 == 0


@pytest.mark.parametrize("mode,group", [("int8", 0), ("int4", 64)])
def test_a_sequences_logits_do_not_depend_on_the_rest_of_the_step(ops, mode, group):
    """Bit for bit: a decode's (and a verify's) logits through the native step are the same alone as beside other
    sequences' decodes, verifies and a prefill chunk, with 2 threads or 1 (seeded sampling replays exactly whatever
    the batch)."""
    model = quantized_model(mode, group)
    ctx_lens, query_lens = [9, 5, 14, 0], [1, 4, 1, 30]
    cache, tables, tokens = prefilled_case(model, ctx_lens, query_lens, seed=4)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        together = native_step(ops, model, cache, tables, ctx_lens, query_lens, tokens)
        torch.set_num_threads(1)
        starts = [0, 1, 5, 6]
        for i in (0, 1, 2):
            alone = native_step(ops, model, cache, [tables[i]], [ctx_lens[i]], [query_lens[i]],
                                tokens[starts[i]:starts[i] + query_lens[i]])
            assert torch.equal(alone, together[starts[i]:starts[i] + query_lens[i]]), i
    finally:
        torch.set_num_threads(before)
