"""int8 / int4 weights (``quantization``) and the int8 KV cache (``kv_cache_dtype``) on a random Qwen3 (q/k norms), a
random Phi-4-mini-layout checkpoint (fused checkpoint projections, LongRoPE on 12 of 16 dims) and a random Gemma 3 (a
sliding layer, sandwich norms, GeGLU-tanh, soft-capped logits), written by transformers' own config classes. Quantized
weights: our quantized model's logits are within the activations' rounding of the float model holding the dequantized
weights, and the engine on the native step (the quantized GEMM inside the op, q/k norms, partial RoPE and Gemma 3's
blocks there) decodes exactly what the quantized model computes densely, for ten prompts at once, with n-gram
speculation too. int8 KV (the eager path: the native step reads fp32 K/V): greedy output agrees with the exact cache's
under concurrency and preemption, and every block comes back."""
from __future__ import annotations

import pytest
import torch

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine, output_token_ids
from backend.model.loader import load_model
from backend.model.quant import QuantLinear, quantize_model
from contracts.sampling_params import SamplingParams
from tests.backend.engine.test_engine_kv_quant import identical_prefix
from tests.helpers.families import FAMILIES, make_family_checkpoint
from tests.helpers.oracle import dense_greedy, dense_logits, repeating_prompts

NEW_TOKENS = 16
GROUP = 32   # divides every projection's inputs (64 and 128)
# the native GEMM rounds activations to int8 per block of 32: a few % of the logits' range (Gemma 3's post-attention
# and post-feedforward norms rescale each sublayer's output, its rounding error with it: 3.6% of the range here)
ROUNDING = {"gemma3": 0.06}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    folder = make_family_checkpoint(tmp_path_factory.mktemp(request.param) / "ckpt", request.param, seed=4)
    prompts = repeating_prompts(5, 10, stem_len=12, span_range=(6, 12), gap_range=(3, 12))
    return request.param, folder, prompts


def dequantized_reference(folder, quantized) -> torch.nn.Module:
    """The float model holding the quantized model's dequantized projections and head."""
    reference = load_model(folder)
    for layer_q, layer_r in zip(quantized.layers, reference.layers):
        for part, names in (("self_attn", ("qkv_proj", "o_proj")), ("mlp", ("gate_up_proj", "down_proj"))):
            for name in names:
                getattr(getattr(layer_r, part), name).weight.copy_(getattr(getattr(layer_q, part), name).dequantized())
    head = quantized.lm_head
    reference.lm_head = torch.nn.Linear(head.in_features, head.out_features, bias=False)
    reference.lm_head.weight.data = head.dequantized().clone()
    return reference


def greedy(engine: LLMEngine, prompts) -> list[list[int]]:
    params = SamplingParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=0.0)
    outs = engine.generate(prompts, [params] * len(prompts))
    assert engine.stats().kv_blocks_used == 0, "blocks leaked"
    return [output_token_ids(o) for o in outs]


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantized_weights_on_the_native_step(family, mode):
    name, folder, prompts = family
    quantized = load_model(folder)
    quantize_model(quantized, mode, GROUP)
    assert isinstance(quantized.layers[0].self_attn.qkv_proj, QuantLinear)
    reference = dequantized_reference(folder, quantized)
    gemm = quantized.lm_head.native_op == "quant_gemm"
    for p in prompts[:3]:
        want = dense_logits(reference, p)
        torch.testing.assert_close(dense_logits(quantized, p), want, rtol=0,
                                   atol=ROUNDING.get(name, 0.04) * float(want.abs().max()) if gemm else 1e-4)
    expected = [dense_greedy(quantized, p, NEW_TOKENS, banned=(1,)) for p in prompts]
    for spec in ({}, dict(speculative_method="ngram", num_speculative_tokens=3)):
        engine = LLMEngine(EngineConfig.from_settings(model_path=str(folder), quantization=mode,
                                                      quantization_group_size=GROUP,
                                                      kv_cache_bytes=8 << 20, device="cpu", fast_decode=True, **spec))
        try:
            assert engine.runner.fast_decode is not None, f"{name}: the native step should serve {mode} weights"
            got = greedy(engine, prompts)
            differ = [i for i, (g, e) in enumerate(zip(got, expected)) if g != e]
            assert not differ, f"{name} {mode} {spec}: prompts {differ} differ from dense decoding"
            assert not spec or engine.scheduler.spec_counters.num_accepted_tokens > 0
        finally:
            engine.shutdown()


def test_int8_kv_agrees_with_the_exact_cache(family):
    name, folder, prompts = family
    runs = {}
    for kv, extra in (("auto", {}), ("int8", {}), ("int8_preempted", dict(num_kv_blocks=12, block_size=16,
                                                                          watermark=0.0, max_model_len=128))):
        engine = LLMEngine(EngineConfig.from_settings(model_path=str(folder), device="cpu",
                                                      kv_cache_dtype=kv.split("_")[0],
                                                      **({"kv_cache_bytes": 8 << 20} if not extra else extra)))
        try:
            assert engine.runner.kv_cache.format.quantized == (kv != "auto")
            runs[kv] = greedy(engine, prompts)
            if extra:
                assert engine.stats().num_preemptions > 0
        finally:
            engine.shutdown()
    exact = runs["auto"]
    for kv in ("int8", "int8_preempted"):
        first = sum(g[0] == e[0] for g, e in zip(runs[kv], exact)) / len(exact)
        prefix = sum(identical_prefix(g, e) for g, e in zip(runs[kv], exact)) / len(exact)
        assert first >= 0.9 and prefix >= 0.6 * NEW_TOKENS, f"{name} {kv}: first-token {first:.2f}, prefix {prefix:.1f}"
