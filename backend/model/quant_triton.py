"""Weight-only int8 / int4 GEMV for decode-sized inputs on CUDA (a Triton kernel; torch has none for our formats).

``y[m] = x[m] @ dequant(W)^T (+ bias)`` for each of the few tokens ``m``: one program per (``BLOCK_N`` output
rows, token), looping over the input in tiles; the integers are dequantized in registers (fp32) and never
written out, so each weight byte is read from memory once per token (from L2 for the next tokens).
Formats as in ``backend/model/quant_pack.py``: int8 [out, in] with scale [out, groups]; int4 packed in
blocks of ``2 * HALF`` columns (byte ``j`` of a block: column ``j`` low nibble, ``j + HALF`` high nibble)
with scale and optional zeros [out, groups]. Tested under ``TRITON_INTERPRET=1`` at small fp32 shapes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from backend.model.quant_pack import int4_block

BLOCK_N = 32


@triton.jit
def _quant_gemv_kernel(
    y_ptr,                      # [num_tokens, out_f]
    x_ptr,                      # [num_tokens, in_f]
    w_ptr,                      # int8 [out_f, in_f] | uint8 [out_f, in_f / 2]
    scale_ptr, zero_ptr,        # [out_f, groups] (zero_ptr: HAS_ZERO only)
    bias_ptr,                   # [out_f] (HAS_BIAS only)
    out_f, in_f, groups, group,
    INT4: tl.constexpr, HALF: tl.constexpr, HAS_ZERO: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    tok = tl.program_id(1)
    rmask = rows < out_f
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    if INT4:
        row_bytes = in_f // 2
        for k0 in range(0, row_bytes, BLOCK_K):
            kb = k0 + tl.arange(0, BLOCK_K)
            kmask = kb < row_bytes
            m2 = rmask[:, None] & kmask[None, :]
            b = tl.load(w_ptr + rows[:, None] * row_bytes + kb[None, :], mask=m2, other=0).to(tl.int32)
            col_lo = (kb // HALF) * (2 * HALF) + kb % HALF
            col_hi = col_lo + HALF
            g_lo = rows[:, None] * groups + (col_lo // group)[None, :]
            g_hi = rows[:, None] * groups + (col_hi // group)[None, :]
            s_lo = tl.load(scale_ptr + g_lo, mask=m2, other=0.0).to(tl.float32)
            s_hi = tl.load(scale_ptr + g_hi, mask=m2, other=0.0).to(tl.float32)
            if HAS_ZERO:
                z_lo = tl.load(zero_ptr + g_lo, mask=m2, other=8.0).to(tl.float32)
                z_hi = tl.load(zero_ptr + g_hi, mask=m2, other=8.0).to(tl.float32)
            else:
                z_lo = 8.0
                z_hi = 8.0
            x_lo = tl.load(x_ptr + tok * in_f + col_lo, mask=kmask, other=0.0).to(tl.float32)
            x_hi = tl.load(x_ptr + tok * in_f + col_hi, mask=kmask, other=0.0).to(tl.float32)
            w_lo = ((b & 0xF).to(tl.float32) - z_lo) * s_lo
            w_hi = ((b >> 4).to(tl.float32) - z_hi) * s_hi
            acc += tl.sum(w_lo * x_lo[None, :] + w_hi * x_hi[None, :], axis=1)
    else:
        for k0 in range(0, in_f, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            kmask = k < in_f
            m2 = rmask[:, None] & kmask[None, :]
            q = tl.load(w_ptr + rows[:, None] * in_f + k[None, :], mask=m2, other=0).to(tl.float32)
            s = tl.load(scale_ptr + rows[:, None] * groups + (k // group)[None, :], mask=m2, other=0.0).to(tl.float32)
            x = tl.load(x_ptr + tok * in_f + k, mask=kmask, other=0.0).to(tl.float32)
            acc += tl.sum(q * s * x[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
    tl.store(y_ptr + tok * out_f + rows, acc.to(y_ptr.dtype.element_ty), mask=rmask)


def triton_quant_gemv(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, zeros: torch.Tensor | None,
                      bias: torch.Tensor | None, mode: str) -> torch.Tensor:
    """x [num_tokens, in] -> [num_tokens, out]; ``mode`` int8 | int4 (``qweight``/``scale``/``zeros`` as above)."""
    x = x.contiguous()
    n, in_f = x.shape
    out_f, groups = scale.shape
    y = torch.empty(n, out_f, dtype=x.dtype, device=x.device)
    int4 = mode == "int4"
    half = int4_block(in_f) // 2 if int4 else 1
    dummy = scale
    _quant_gemv_kernel[(triton.cdiv(out_f, BLOCK_N), n)](
        y, x, qweight, scale, zeros if zeros is not None else dummy, bias if bias is not None else dummy,
        out_f, in_f, groups, in_f // groups,
        INT4=int4, HALF=half, HAS_ZERO=zeros is not None, HAS_BIAS=bias is not None,
        BLOCK_N=BLOCK_N, BLOCK_K=64 if int4 else 128)
    return y
