"""Write each new token's K and V into its cache slot (vLLM's ``reshape_and_cache``)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from backend.attention.kernels.common import next_pow2


@triton.jit
def _reshape_and_cache_kernel(
    k_ptr, v_ptr,                  # [num_tokens, num_kv_heads, head_dim]
    k_cache_ptr, v_cache_ptr,      # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_ptr,                      # [num_tokens] int64; a negative slot means "skip"
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_ct, stride_ch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    KVH_PAD: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
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
    k = tl.load(k_ptr + src_k, mask=mask)
    v = tl.load(v_ptr + src_v, mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def reshape_and_cache(
    k: torch.Tensor,             # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,             # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,       # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,       # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64
) -> None:
    num_tokens, kvh, d = k.shape
    if num_tokens == 0:
        return
    if k.stride(-1) != 1 or v.stride(-1) != 1 or k_cache.stride(-1) != 1:
        raise ValueError("reshape_and_cache needs unit stride on head_dim")
    if k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must share strides")
    _reshape_and_cache_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=kvh, HEAD_DIM=d, KVH_PAD=next_pow2(kvh), HEAD_DIM_PAD=next_pow2(d),
        BLOCK_SIZE=k_cache.shape[1],
    )
