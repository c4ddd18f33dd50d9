"""Triton kernels for the elementwise work of a Llama layer on CUDA: one kernel where torch launches several.

On an H200 the captured decode step of a 16-layer bf16 model spent about 1.6 ms of GPU time per batch-1 step
against 0.36 ms of weight reads (docs/gpu.md): some 30 small kernels per layer at a few microseconds each. These
three replace about 20 of them:

- ``add_rms_norm``: the residual add and the RMSNorm after it (torch: an add, then a cast, square, mean, add,
  rsqrt, multiply, cast and the weight's multiply);
- ``silu_mul``: ``silu(gate) * up`` from the fused gate/up projection's output (torch: the silu and the multiply);
- ``rope``: the rotation of q and k together (torch: a negation, a concatenation, two multiplies and an add).

Each rounds as the torch ops it replaces do (the storage dtype after every op that torch rounds), so in fp32
the results agree to rounding and in half precision to one unit in the last place (reductions and ``exp``
differ in order and implementation). ``backend/model/fused.py`` holds the torch references and decides whether
these run. Tested under ``TRITON_INTERPRET=1`` at small fp32 / fp16 shapes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(
    out_ptr, res_out_ptr,        # [rows, cols]: normed; the new residual (HAS_RESIDUAL only)
    x_ptr, res_ptr, w_ptr,       # [rows, cols] x; [rows, cols] residual (HAS_RESIDUAL only); [cols] weight
    cols, x_stride, res_stride, eps,
    HAS_RESIDUAL: tl.constexpr, HALF_PRECISION: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    mask = c < cols
    x = tl.load(x_ptr + row * x_stride + c, mask=mask, other=0.0)
    dtype = x.dtype
    xf = x.to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + c, mask=mask, other=0.0).to(tl.float32)
        s = (xf + r).to(dtype)                              # torch's add rounds to the storage dtype
        tl.store(res_out_ptr + row * cols + c, s, mask=mask)
        xf = s.to(tl.float32)
    ms = tl.sum(xf * xf, axis=0) / cols
    normed = xf * (1.0 / tl.sqrt(ms + eps))
    if HALF_PRECISION:
        normed = normed.to(dtype).to(tl.float32)            # HF casts back before the weight's multiply
    w = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * cols + c, (w * normed).to(dtype), mask=mask)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [rows, cols] (rows with unit column stride), weight [cols] -> (normed, new residual).
    Without a residual the new residual is ``x`` itself."""
    rows, cols = x.shape
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else x
    block = triton.next_power_of_2(cols)
    _add_rms_norm_kernel[(rows,)](
        out, res_out, x, residual if residual is not None else x, weight, cols, x.stride(0),
        residual.stride(0) if residual is not None else 0, eps,
        HAS_RESIDUAL=residual is not None, HALF_PRECISION=x.dtype != torch.float32, BLOCK=block,
        num_warps=min(16, max(1, block // 256)))
    return out, res_out


@triton.jit
def _silu_mul_kernel(out_ptr, gu_ptr, cols, gu_stride, HALF_PRECISION: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = c < cols
    g = tl.load(gu_ptr + row * gu_stride + c, mask=mask, other=0.0)
    dtype = g.dtype
    u = tl.load(gu_ptr + row * gu_stride + cols + c, mask=mask, other=0.0).to(tl.float32)
    gf = g.to(tl.float32)
    s = gf / (1.0 + tl.exp(-gf))                            # torch's silu, in fp32
    if HALF_PRECISION:
        s = s.to(dtype).to(tl.float32)                      # silu's output is rounded before the multiply
    tl.store(out_ptr + row * cols + c, (s * u).to(dtype), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [rows, 2 * cols] (gate then up) -> silu(gate) * up [rows, cols]."""
    rows, cols = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((rows, cols), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(cols))
    _silu_mul_kernel[(rows, triton.cdiv(cols, block))](
        out, gate_up, cols, gate_up.stride(0), HALF_PRECISION=gate_up.dtype != torch.float32, BLOCK=block)
    return out


@triton.jit
def _rope_kernel(
    out_ptr,                     # [tokens, heads, head_dim], contiguous
    x_ptr,                       # [tokens, heads, head_dim], unit stride along head_dim
    cos_ptr, sin_ptr,            # [tokens, head_dim], contiguous
    heads, x_tok_stride, x_head_stride,
    HALF: tl.constexpr, HALF_PRECISION: tl.constexpr, BLOCK: tl.constexpr,
):
    tok = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, BLOCK)
    mask = d < HALF
    base = x_ptr + tok * x_tok_stride + head * x_head_stride
    x1 = tl.load(base + d, mask=mask, other=0.0)
    dtype = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = tl.load(base + HALF + d, mask=mask, other=0.0).to(tl.float32)
    c1 = tl.load(cos_ptr + tok * 2 * HALF + d, mask=mask, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + tok * 2 * HALF + HALF + d, mask=mask, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + tok * 2 * HALF + d, mask=mask, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + tok * 2 * HALF + HALF + d, mask=mask, other=0.0).to(tl.float32)
    # torch: x * cos + cat(-x2, x1) * sin, each product and the sum rounded to the storage dtype
    a1 = x1 * c1
    b1 = -x2 * s1
    a2 = x2 * c2
    b2 = x1 * s2
    if HALF_PRECISION:
        a1 = a1.to(dtype).to(tl.float32)
        b1 = b1.to(dtype).to(tl.float32)
        a2 = a2.to(dtype).to(tl.float32)
        b2 = b2.to(dtype).to(tl.float32)
    out = out_ptr + (tok * heads + head) * 2 * HALF
    tl.store(out + d, (a1 + b1).to(dtype), mask=mask)
    tl.store(out + HALF + d, (a2 + b2).to(dtype), mask=mask)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [tokens, heads, head_dim] (a view; unit stride along head_dim), cos / sin [tokens, 1, head_dim] ->
    the rotated x, contiguous."""
    tokens, heads, head_dim = x.shape
    out = torch.empty((tokens, heads, head_dim), dtype=x.dtype, device=x.device)
    half = head_dim // 2
    _rope_kernel[(tokens, heads)](
        out, x, cos.contiguous(), sin.contiguous(), heads, x.stride(0), x.stride(1),
        HALF=half, HALF_PRECISION=x.dtype != torch.float32, BLOCK=triton.next_power_of_2(half),
        num_warps=1 if half <= 64 else 2)                       # one (token, head) per program: 64-128 lanes
    return out
