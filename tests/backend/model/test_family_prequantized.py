"""GPTQ and AWQ checkpoints of the families beside Llama: a Qwen3 (q/k norms and q/k/v/o biases, which stay in full
precision beside the packed projections), a Phi-4-mini-layout Phi-3 (its fused ``qkv_proj`` and ``gate_up_proj``
quantized as one module each, as GPTQ and AutoAWQ quantize them) and a Gemma 3 (its four norms a layer, ``1 + w`` q/k
norms and q/k/v/o biases unquantized; a sliding layer, soft-capped logits), written by tools/make_gptq_checkpoint.py
from random checkpoints made by transformers' own config classes. Loaded with every projection within a step of the
float weight (the exact mapping is family-independent: test_quant_gptq.py, test_quant_awq.py) and the norms and biases
as they were; served by the engine, eagerly and on the native step, as dense decoding of the loaded model."""
from __future__ import annotations

import pytest
import torch

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine, output_token_ids
from backend.model.loader import load_model
from backend.model.quant import QuantLinear, linear_targets
from contracts.sampling_params import SamplingParams
from tests.helpers.families import make_family_checkpoint
from tests.helpers.oracle import dense_greedy, repeating_prompts
from tools.make_gptq_checkpoint import make

NEW_TOKENS = 10
FORMATS = {"gptq4_asym": dict(bits=4, group=32, sym=False), "gptq8": dict(bits=8, group=32),
           "awq": dict(group=32, awq=True)}
CHECKPOINTS = {"qwen3": dict(attention_bias=True), "phi4_partial": {}, "gemma3": dict(attention_bias=True)}
NORMS = {"gemma3": ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                    "post_feedforward_layernorm")}


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def family(request, tmp_path_factory):
    name = request.param
    return name, make_family_checkpoint(tmp_path_factory.mktemp(name) / "ckpt", name, seed=6, **CHECKPOINTS[name])


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_prequantized_is_served_as_its_dequantized_weights(family, tmp_path, fmt):
    name, folder = family
    ckpt = make(folder, tmp_path / fmt, **FORMATS[fmt])
    quantized = load_model(ckpt)
    floats = load_model(folder)
    for (parent_q, attr), (parent_f, _) in zip(linear_targets(quantized).values(), linear_targets(floats).values()):
        layer, weight = getattr(parent_q, attr), getattr(parent_f, attr).weight
        assert isinstance(layer, QuantLinear) and layer.mode == ("int8" if fmt == "gptq8" else "int4")
        assert (layer.dequantized() - weight).abs().max() <= layer.scale.max(), attr
    for ours, theirs in zip(quantized.layers, floats.layers):
        for norm in NORMS.get(name, ("input_layernorm", "post_attention_layernorm")):
            assert torch.equal(getattr(ours, norm).weight, getattr(theirs, norm).weight)
        if name in ("qwen3", "gemma3"):
            for norm in ("q_norm", "k_norm"):
                assert torch.equal(getattr(ours.self_attn, norm).weight, getattr(theirs.self_attn, norm).weight)
            for proj in ("qkv_proj", "o_proj"):
                assert torch.equal(getattr(ours.self_attn, proj).bias, getattr(theirs.self_attn, proj).bias)
    prompts = repeating_prompts(3, 6, stem_len=8, span_range=(4, 8), gap_range=(2, 6))
    expected = [dense_greedy(quantized, p, NEW_TOKENS, banned=(1,)) for p in prompts]
    params = SamplingParams(max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=0.0)
    for fast in (False, True):
        engine = LLMEngine(EngineConfig.from_settings(model_path=str(ckpt), kv_cache_bytes=8 << 20, device="cpu",
                                                      fast_decode=fast))
        try:
            assert (engine.runner.fast_decode is not None) == fast
            got = [output_token_ids(o) for o in engine.generate(prompts, [params] * len(prompts))]
            assert got == expected, f"{name} {fmt} fast_decode={fast}"
            assert engine.stats().kv_blocks_used == 0
        finally:
            engine.shutdown()
