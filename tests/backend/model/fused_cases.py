"""The fused elementwise kernels (backend/model/fused_kernels.py) under the interpreter, against their torch
references (backend/model/fused.py), alone, inside the model's forward and through the engine. Run by
``test_fused.py`` in a fresh process with ``TRITON_INTERPRET=1`` (fp32 and fp16: the interpreter computes bf16
wrongly)."""
import os

if os.environ.get("TRITON_INTERPRET") != "1":
    raise RuntimeError("run with TRITON_INTERPRET=1 (see test_fused.py)")

import pytest
import torch

from backend.attention.dense import DenseCausalAttention
from backend.model import fused_kernels as k
from backend.model.config import ModelConfig
from backend.model.fused import add_rms_norm_reference, fused_ops, silu_mul_reference
from backend.model.llama import LlamaForCausalLM
from backend.model.rope import apply_rope

TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.float16: {"atol": 2e-3, "rtol": 2e-3}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows,cols", [(1, 64), (3, 96), (2, 200)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm(dtype, rows, cols, with_residual):
    torch.manual_seed(rows * cols)
    x = torch.randn(rows, cols).to(dtype)
    residual = torch.randn(rows, cols).to(dtype) if with_residual else None
    w = (1 + 0.1 * torch.randn(cols)).to(dtype)
    got, want = k.add_rms_norm(x, residual, w, 1e-5), add_rms_norm_reference(x, residual, w, 1e-5)
    torch.testing.assert_close(got[0], want[0], **TOL[dtype])
    assert torch.equal(got[1], want[1])                   # the residual add rounds exactly as torch's


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows,cols", [(1, 80), (3, 1500)])          # 1500: two column blocks
def test_silu_mul(dtype, rows, cols):
    torch.manual_seed(cols)
    gate_up = (2 * torch.randn(rows, 2 * cols)).to(dtype)
    torch.testing.assert_close(k.silu_mul(gate_up), silu_mul_reference(gate_up), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 80])                       # 80: a half of 40, masked lanes
def test_rope_on_the_q_and_k_view(dtype, head_dim):
    torch.manual_seed(head_dim)
    qkv = torch.randn(3, 4 + 2 * 2, head_dim).to(dtype)               # q, k, v heads of a GQA layer
    angles = torch.rand(3, 1, head_dim // 2) * 6.28
    cos = torch.cat((angles.cos(), angles.cos()), -1).to(dtype)
    sin = torch.cat((angles.sin(), angles.sin()), -1).to(dtype)
    view = qkv[:, :6]                                                 # strided, as in Attention.forward
    torch.testing.assert_close(k.rope(view, cos, sin), apply_rope(view, cos, sin), **TOL[dtype])


def tiny_model(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 96,
                                 "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
                                 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64})
    model = LlamaForCausalLM(cfg).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.2)
    return model


@torch.no_grad()
def test_the_fused_forward_equals_the_torch_forward():
    model = tiny_model(0)
    ops, why = fused_ops(torch.device("cpu"), torch.float32, model.config.head_dim)
    assert ops is not None, why
    ids, pos = torch.randint(0, 96, (10,)), torch.arange(10)
    want = model(ids, pos, DenseCausalAttention(1, 10))
    model.fused = ops
    got = model(ids, pos, DenseCausalAttention(1, 10))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    model.fused = None


def test_greedy_tokens_through_the_engine_with_and_without_fused_ops(tiny_checkpoint, monkeypatch):
    from backend.config import EngineConfig
    from backend.engine.llm_engine import LLMEngine, output_token_ids
    from contracts.sampling_params import SamplingParams

    prompts = [[0] + list(range(30 + i, 42 + 2 * i)) for i in range(3)]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    outs = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("TRITON_LLM_FUSED", flag)
        eng = LLMEngine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), device="cpu", max_num_seqs=4,
                                                   speculative_method="ngram", num_speculative_tokens=2))
        assert ("fused ops on" in eng.parts.summary) == (flag == "1"), eng.parts.summary
        assert (eng.runner.model.fused is not None) == (flag == "1")
        outs[flag] = [output_token_ids(o) for o in eng.generate(prompts, params)]
    assert outs["1"] == outs["0"]
