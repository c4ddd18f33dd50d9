"""Weight-only quantization: bounded error per weight, the layer equals a matmul with its dequantized
weight, and the engine's greedy output equals dense decoding of the dequantized model."""
from __future__ import annotations

import pytest
import torch

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine, output_token_ids
from backend.model.loader import load_model
from backend.model.quant import (
    QuantLinear,
    dequantize_int4,
    linear_targets,
    quantize_int4,
    quantize_int8,
    quantize_model,
)
from contracts.sampling_params import SamplingParams
from tests.helpers.oracle import dense_greedy, dense_logits


def test_int8_error_is_at_most_half_a_step_per_channel():
    w = torch.randn(64, 96)
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (64,)
    assert ((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-6).all()


def test_int4_packs_two_per_byte_and_errs_at_most_half_a_step_per_group():
    w = torch.randn(8, 64)
    packed, scale = quantize_int4(w, 16)
    assert packed.dtype == torch.uint8 and packed.shape == (8, 32) and scale.shape == (8, 4)
    deq = dequantize_int4(packed, scale, torch.empty(8, 64))
    step = scale.repeat_interleave(16, dim=1)
    assert ((deq - w).abs() <= step / 2 + 1e-6).all()


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_layer_is_a_matmul_with_its_dequantized_weight(mode):
    lin = torch.nn.Linear(64, 48, bias=True)
    q = QuantLinear.from_linear(lin, mode, 16, {})
    x = torch.randn(5, 64)
    assert torch.allclose(q.forward(x), torch.nn.functional.linear(x, q.dequantized(), lin.bias), atol=1e-5)
    assert q.nbytes < lin.weight.numel() * 4 / (3.5 if mode == "int8" else 5)   # int4 at group 16: 6 bits a weight


def test_bad_settings_name_the_parameter(tiny_checkpoint):
    with pytest.raises(ValueError, match="^quantization_group_size"):
        quantize_model(load_model(tiny_checkpoint), "int4", 48)        # does not divide hidden 64
    with pytest.raises(ValueError, match="^quantization: fp8 needs a CUDA device"):
        quantize_model(load_model(tiny_checkpoint), "fp8")
    with pytest.raises(ValueError, match="^quantization"):
        EngineConfig.from_settings(model_path="/m", quantization="int3")


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_engine_greedy_equals_dense_decoding_of_the_quantized_model(tiny_checkpoint, mode):
    """The engine decodes what the quantized model computes densely; with the native GEMM (activations quantized
    to int8 per block of 32) that is within the activations' rounding of the dequantized model, else equal to it."""
    quantized = load_model(tiny_checkpoint)
    quantize_model(quantized, mode, 32)
    reference = load_model(tiny_checkpoint)                 # plain model holding the dequantized weights
    for layer_q, layer_r in zip(quantized.layers, reference.layers):
        for part, names in (("self_attn", ("qkv_proj", "o_proj")), ("mlp", ("gate_up_proj", "down_proj"))):
            for name in names:
                getattr(getattr(layer_r, part), name).weight.copy_(getattr(getattr(layer_q, part), name).dequantized())
    assert isinstance(quantized.lm_head, QuantLinear) and quantized.lm_head.mode == "int8"    # the head: int8
    reference.lm_head = torch.nn.Linear(64, quantized.lm_head.out_features, bias=False)       # untied from the
    reference.lm_head.weight.data = quantized.lm_head.dequantized().clone()                   # full-precision embedding
    assert torch.equal(quantized.embed_tokens.weight, load_model(tiny_checkpoint).embed_tokens.weight)
    prompt = [0, 17, 230, 999, 45, 3000, 12]
    gemm = quantized.lm_head.native_op == "quant_gemm"
    assert torch.allclose(dense_logits(quantized, prompt), dense_logits(reference, prompt), atol=5e-2 if gemm else 1e-4)
    expected = dense_greedy(quantized, prompt, 12, banned=(1,))
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), quantization=mode,
                                                  quantization_group_size=32,
                                                  kv_cache_bytes=8 << 20, device="cpu"))
    outs, = engine.generate([prompt], SamplingParams(max_tokens=12, min_tokens=12, temperature=0.0))
    assert output_token_ids(outs) == expected
    assert engine.stats().kv_blocks_used == 0


def test_chunked_int8_decode_path_equals_the_whole_layer():
    lin = torch.nn.Linear(1024, 700, bias=True)       # 512 KiB chunks of 1024 fp32 columns: 128 rows, 6 chunks
    q = QuantLinear.from_linear(lin, "int8", 0, {})
    assert q.chunk_rows < q.out_features
    x = torch.randn(3, 1024)
    whole = torch.nn.functional.linear(x, q.dequantized(), lin.bias)
    assert torch.allclose(q.forward(x), whole, atol=1e-4)
    many = torch.randn(20, 1024)                      # prefill-sized input: the whole-layer path
    assert torch.allclose(q.forward(many), torch.nn.functional.linear(many, q.dequantized(), lin.bias), atol=1e-4)


def test_an_untied_lm_head_is_quantized_to_int8_and_its_bytes_counted(tmp_path):
    from tests.helpers.checkpoints import make_random_checkpoint
    ckpt = make_random_checkpoint(tmp_path / "untied", tie=False)
    model = load_model(ckpt)
    head_fp32 = model.lm_head.weight.clone()
    projections = sum(getattr(parent, name).weight.numel() * 4 for parent, name in linear_targets(model).values())
    saved = quantize_model(model, "int4", 32)
    head = model.lm_head
    assert isinstance(head, QuantLinear) and head.mode == "int8"
    assert (head.dequantized() - head_fp32).abs().max() <= head.scale.max() / 2 + 1e-6
    int4_bytes = sum(m.nbytes for m in model.modules() if isinstance(m, QuantLinear) and m is not head)
    assert saved == projections - int4_bytes + head_fp32.numel() * 4 - head.nbytes
    assert model.embed_tokens.weight.dtype == torch.float32
