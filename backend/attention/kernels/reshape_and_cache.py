"""Write each new token's K and V into its cache slot (vLLM's ``reshape_and_cache``).

A quantized cache (int8 / float8 codes, ``backend/core/kv_quant.py``) gets each token's codes and
one fp16 scale per KV head, computed here exactly as ``quantize_per_token_head`` does.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from backend.attention.kernels.common import check_scales, next_pow2
from backend.core.kv_quant import FP8_MAX, INT8_MAX, MIN_SCALE


@triton.jit
def _quantize_rows(x, scale_ptr, s_off, h_mask, QMAX: tl.constexpr, MIN_S: tl.constexpr, IS_INT8: tl.constexpr,
                   OUT_DTYPE: tl.constexpr):
    """x: [KVH_PAD, HEAD_DIM_PAD] -> codes in OUT_DTYPE; stores one fp16 scale per row at ``scale_ptr + s_off``."""
    xf = x.to(tl.float32)
    s = tl.maximum(tl.max(tl.abs(xf), 1) / QMAX, MIN_S).to(tl.float16)    # [KVH_PAD]
    tl.store(scale_ptr + s_off, s, mask=h_mask)
    y = xf / s.to(tl.float32)[:, None]
    if IS_INT8:
        y = tl.floor(y + 0.5)
    y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
    return y.to(OUT_DTYPE)


@triton.jit
def _reshape_and_cache_kernel(
    k_ptr, v_ptr,                  # [num_tokens, num_kv_heads, head_dim]
    k_cache_ptr, v_cache_ptr,      # [num_blocks, block_size, num_kv_heads, head_dim]
    k_scale_ptr, v_scale_ptr,      # [num_blocks, block_size, num_kv_heads] fp16 (QUANT; else unused)
    slot_ptr,                      # [num_tokens] int64; a negative slot means "skip"
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_ct, stride_ch, stride_sb, stride_st,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    KVH_PAD: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    QUANT: tl.constexpr, QMAX: tl.constexpr, MIN_S: tl.constexpr, IS_INT8: tl.constexpr,
):
    tok = tl.program_id(0)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    offs_h = tl.arange(0, KVH_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
    src_k = tok * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :]
    src_v = tok * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
    dst = blk * stride_cb + off * stride_ct + offs_h[:, None] * stride_ch + offs_d[None, :]
    k = tl.load(k_ptr + src_k, mask=mask, other=0.0)
    v = tl.load(v_ptr + src_v, mask=mask, other=0.0)
    if QUANT:
        s_off = blk * stride_sb + off * stride_st + offs_h
        h_mask = offs_h < NUM_KV_HEADS
        k = _quantize_rows(k, k_scale_ptr, s_off, h_mask, QMAX, MIN_S, IS_INT8, k_cache_ptr.dtype.element_ty)
        v = _quantize_rows(v, v_scale_ptr, s_off, h_mask, QMAX, MIN_S, IS_INT8, v_cache_ptr.dtype.element_ty)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def reshape_and_cache(
    k: torch.Tensor,             # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,             # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,       # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,       # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] fp16: a quantized cache
    v_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] fp16
) -> None:
    num_tokens, kvh, d = k.shape
    if num_tokens == 0:
        return
    if k.stride(-1) != 1 or v.stride(-1) != 1 or k_cache.stride(-1) != 1:
        raise ValueError("reshape_and_cache needs unit stride on head_dim")
    if k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must share strides")
    quant = check_scales(k_cache, k_scale, v_scale)
    _reshape_and_cache_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, k_scale if quant else k_cache, v_scale if quant else v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_scale.stride(0) if quant else 0, k_scale.stride(1) if quant else 0,
        NUM_KV_HEADS=kvh, HEAD_DIM=d, KVH_PAD=next_pow2(kvh), HEAD_DIM_PAD=next_pow2(d),
        BLOCK_SIZE=k_cache.shape[1], QUANT=quant, QMAX=INT8_MAX if k_cache.dtype == torch.int8 else FP8_MAX,
        MIN_S=MIN_SCALE, IS_INT8=k_cache.dtype == torch.int8,
    )

