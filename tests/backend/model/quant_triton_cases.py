"""The Triton weight-only GEMV (backend/model/quant_triton.py) under the interpreter, against a matmul with
the dequantized weight. Run by ``test_quant_triton.py`` in a fresh process with ``TRITON_INTERPRET=1``."""
import os

if os.environ.get("TRITON_INTERPRET") != "1":
    raise RuntimeError("run with TRITON_INTERPRET=1 (see test_quant_triton.py)")

import pytest
import torch
import torch.nn.functional as F

from backend.model.quant_pack import dequantize_int4, dequantize_int8, pack_int4
from backend.model.quant_triton import triton_quant_gemv


@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("out_f,in_f,groups", [(37, 96, 1), (40, 130, 1), (33, 256, 4)])
def test_int8(tokens, out_f, in_f, groups):
    torch.manual_seed(out_f + tokens)
    q = torch.randint(-127, 128, (out_f, in_f), dtype=torch.int8)
    scale = torch.rand(out_f, groups) * 0.01
    x, bias = torch.randn(tokens, in_f), torch.randn(out_f)
    w = dequantize_int8(q, scale, torch.empty(out_f, in_f))
    torch.testing.assert_close(triton_quant_gemv(x, q, scale, None, bias, "int8"), F.linear(x, w, bias),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tokens", [1, 2])
@pytest.mark.parametrize("out_f,in_f,group", [(37, 128, 32), (20, 192, 64), (9, 48, 16), (33, 70, 10)])
@pytest.mark.parametrize("asymmetric", [False, True])
def test_int4(tokens, out_f, in_f, group, asymmetric):
    torch.manual_seed(out_f + tokens)
    packed = pack_int4(torch.randint(0, 16, (out_f, in_f)))      # blocks of 32, or pairs when 32 does not divide
    scale = torch.rand(out_f, in_f // group) * 0.1
    zeros = torch.randint(0, 17, scale.shape).float() if asymmetric else None
    x = torch.randn(tokens, in_f)
    w = dequantize_int4(packed, scale, torch.empty(out_f, in_f), zeros)
    torch.testing.assert_close(triton_quant_gemv(x, packed, scale, zeros, None, "int4"), F.linear(x, w),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_half_precision_inputs_and_scales(mode):
    """As on CUDA: x, scales and output in the compute dtype (fp16 here: the interpreter computes bf16 wrongly)."""
    torch.manual_seed(7)
    out_f, in_f, group = 40, 128, 32
    scale = (torch.rand(out_f, in_f // group) * 0.05).half()
    if mode == "int8":
        q = torch.randint(-127, 128, (out_f, in_f), dtype=torch.int8)
        w = dequantize_int8(q, scale.float(), torch.empty(out_f, in_f))
    else:
        q = pack_int4(torch.randint(0, 16, (out_f, in_f)))
        w = dequantize_int4(q, scale.float(), torch.empty(out_f, in_f))
    x = torch.randn(2, in_f).half()
    y = triton_quant_gemv(x, q, scale, None, None, mode)
    assert y.dtype == torch.float16
    torch.testing.assert_close(y.float(), F.linear(x.float(), w), atol=2e-2, rtol=1e-2)
