"""The native int8/int4 GEMV kernels (backend/native/csrc/quant_gemv.cpp) against a matmul with the
dequantized weight: odd widths, every group size the kernel takes, 1..8 tokens, 1 and 2 threads; and which native op
QuantLinear takes (the quantized GEMM, quant_gemm.h, where the layer fits it)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from backend.model.quant import FEW_TOKENS, QuantizedWeight, QuantLinear, quantize_weight
from backend.model.quant_pack import dequantize_int4, dequantize_int8, pack_int4, unpack_int4
from backend.model.quant_strips import quant_gemm_reference
from backend.native import native_ops

BUILD = native_ops()
pytestmark = pytest.mark.skipif(not BUILD.available, reason=f"native ops unavailable: {BUILD.reason}")


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def close(y: torch.Tensor, ref: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> bool:
    """Summation-order error bound: a few ulps of sum |x| |w| per output."""
    bound = 1e-6 * (x.abs() @ w.abs().t()) + 1e-6
    return bool(((y - ref).abs() <= bound).all())


@pytest.mark.parametrize("tokens", range(1, FEW_TOKENS + 1))
@pytest.mark.parametrize("out_f,in_f", [(37, 96), (64, 773), (130, 16), (5, 1000), (33, 7)])
def test_int8_per_channel_equals_dequantized_matmul(threads, tokens, out_f, in_f):
    torch.manual_seed(out_f * in_f + tokens)
    qw = quantize_weight(torch.randn(out_f, in_f), "int8", in_f)
    x, bias = torch.randn(tokens, in_f), torch.randn(out_f)
    w = dequantize_int8(qw.qweight, qw.scale, torch.empty(out_f, in_f))
    for b in (None, bias):
        y = BUILD.ops.quant_gemv_int8(x, qw.qweight, qw.scale, b)
        assert close(y, F.linear(x, w, b), x, w)


@pytest.mark.parametrize("tokens", [1, 3, 8])
@pytest.mark.parametrize("group", [16, 32, 64, 128])
def test_int8_grouped_equals_dequantized_matmul(threads, tokens, group):
    torch.manual_seed(group + tokens)
    out_f, in_f = 45, 384
    q = torch.randint(-128, 128, (out_f, in_f), dtype=torch.int8)
    scale = torch.rand(out_f, in_f // group) * 0.01
    x = torch.randn(tokens, in_f)
    w = dequantize_int8(q, scale, torch.empty(out_f, in_f))
    assert close(BUILD.ops.quant_gemv_int8(x, q, scale, None), F.linear(x, w), x, w)


@pytest.mark.parametrize("tokens", range(1, FEW_TOKENS + 1))
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("out_f,in_f", [(37, 384), (3, 128), (129, 896)])
@pytest.mark.parametrize("asymmetric", [False, True], ids=["sym", "zeros"])
def test_int4_equals_dequantized_matmul(threads, tokens, group, out_f, in_f, asymmetric):
    assert in_f % group == 0   # every width in the grid is a multiple of every group
    torch.manual_seed(group * tokens + out_f)
    n = torch.randint(0, 16, (out_f, in_f))
    scale = torch.rand(out_f, in_f // group) * 0.1
    zeros = torch.randint(0, 17, scale.shape).float() if asymmetric else None
    packed = pack_int4(n)
    x, bias = torch.randn(tokens, in_f), torch.randn(out_f)
    w = dequantize_int4(packed, scale, torch.empty(out_f, in_f), zeros)
    ref = (n.float() - (8 if zeros is None else zeros.repeat_interleave(group, 1))) * scale.repeat_interleave(group, 1)
    assert torch.equal(w, ref)                      # the torch dequantization is the format's definition
    assert close(BUILD.ops.quant_gemv_int4(x, packed, scale, zeros, bias), F.linear(x, w, bias), x, w)


def test_bad_shapes_are_refused():
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        BUILD.ops.quant_gemv_int4(x, torch.zeros(4, 32, dtype=torch.uint8), torch.ones(4, 4), None, None)
    with pytest.raises(RuntimeError, match="1..8 rows"):
        BUILD.ops.quant_gemv_int8(torch.randn(9, 64), torch.zeros(4, 64, dtype=torch.int8), torch.ones(4, 1), None)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        BUILD.ops.quant_gemv_int8(x, torch.zeros(4, 63, dtype=torch.int8), torch.ones(4, 1), None)


def activation_step_bound(x: torch.Tensor, w: torch.Tensor, group: int) -> torch.Tensor:  # [n, out]
    """Design (b)'s error bound: half an int8 activation step (max |x| / 127 per group) times the group's sum |w|."""
    step = x.view(x.shape[0], -1, group).abs().amax(2) / 127                   # [n, groups]
    return (step / 2) @ w.abs().view(w.shape[0], -1, group).sum(2).t() * 1.001 + 1e-5


@pytest.mark.parametrize("mode,group", [("int8", 0), ("int4", 32), ("int4", 64), ("int4", 128)])
def test_layer_takes_the_gemm_at_every_token_count(mode, group):
    """QuantLinear runs quant_gemm (backend/native/csrc/quant_gemm.h) for any step: the float64 maths of the block-wise
    int8 activations times its integer weights, and within an activation step of the torch path's matmul."""
    lin = torch.nn.Linear(256, 100, bias=True)
    fast = QuantLinear.from_linear(lin, mode, group, {}, BUILD.ops)
    slow = QuantLinear.from_linear(lin, mode, group, {}, None)
    assert fast.native_op == "quant_gemm" and slow.native_op is None
    w = slow.dequantized().clone()
    if mode == "int8":
        ints, zeros = fast.qweight.double(), torch.zeros(100, 1)
    else:
        ints, zeros = unpack_int4(fast.qweight).double(), torch.full_like(fast.scale, 8.0)
    for n in (1, 5, FEW_TOKENS + 3, 40):
        x = torch.randn(n, 256)
        xq, sx, _ = BUILD.ops.quant_quantize_blocks(x)
        exact = quant_gemm_reference(xq.double(), sx, ints, fast.scale, zeros, lin.bias.detach())
        y = fast.forward(x)
        assert ((y.double() - exact).abs() <= 1e-5 * (1 + exact.abs())).all()
        assert ((y - F.linear(x, w, lin.bias)).abs() <= activation_step_bound(x, w, 32)).all()


def test_layers_the_kernel_does_not_fit_keep_the_torch_path():
    lin = torch.nn.Linear(96, 8)
    assert QuantLinear.from_linear(lin, "int4", 16, {}, BUILD.ops).native_op is None   # group not 32k
    odd = QuantizedWeight("int8", torch.zeros(8, 96, dtype=torch.int8), torch.ones(8, 12), 8)
    assert QuantLinear(odd, None, torch.float32, {}, BUILD.ops).native_op is None      # groups of 8
    assert QuantLinear.from_linear(lin.to(torch.bfloat16), "int8", 0, {}, BUILD.ops).native_op is None


@pytest.mark.parametrize("tokens", [1, 2, 5, 8])
@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize("asymmetric", [False, True], ids=["sym", "zeros"])
def test_int4_with_int8_activations_errs_at_most_half_an_activation_step(threads, tokens, group, asymmetric):
    """Design (b): x is quantized per (token, group) to int8 with step max|x| / 127, so each output is off by at
    most sum over groups of step / 2 * sum |w| (plus float rounding)."""
    torch.manual_seed(group * tokens)
    out_f, in_f = 45, 384
    packed = pack_int4(torch.randint(0, 16, (out_f, in_f)))
    scale = torch.rand(out_f, in_f // group) * 0.1
    zeros = torch.randint(0, 17, scale.shape).float() if asymmetric else None
    x = torch.randn(tokens, in_f)
    w = dequantize_int4(packed, scale, torch.empty(out_f, in_f), zeros)
    y = BUILD.ops.quant_gemv_int4_q8(x, packed, scale, zeros, None)
    err = (y - F.linear(x, w)).abs()
    assert (err <= activation_step_bound(x, w, group)).all() and err.max() > 0                             # inexact, within the bound
    with pytest.raises(RuntimeError, match="multiple of 64"):
        BUILD.ops.quant_gemv_int4_q8(x, packed, torch.ones(out_f, in_f // 32), None, None)


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("asymmetric", [False, True], ids=["sym", "zeros"])
def test_native_int4_dequantization_is_bit_identical_to_torchs(threads, group, asymmetric):
    torch.manual_seed(group)
    out_f, in_f = 37, 384
    packed = pack_int4(torch.randint(0, 16, (out_f, in_f)))
    scale = torch.rand(out_f, in_f // group)
    zeros = torch.randint(0, 17, scale.shape).float() if asymmetric else None
    out = torch.empty(out_f, in_f)
    assert BUILD.ops.quant_dequant_int4(packed, scale, zeros, out).data_ptr() == out.data_ptr()
    assert torch.equal(out, dequantize_int4(packed, scale, torch.empty(out_f, in_f), zeros))
