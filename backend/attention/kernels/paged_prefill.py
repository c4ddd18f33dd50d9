"""Attention of several query tokens per sequence over paged KV, causal by position.

Serves prefill chunks, prefix-cache hits and draft verification alike: query token ``i``
of a sequence with ``query_len`` new tokens and ``seq_len`` tokens in all sits at position
``seq_len - query_len + i`` and sees every key at a position ``<=`` its own (the new keys
are already in the cache, written by ``reshape_and_cache``).

Each program takes ``BLOCK_Q`` query tokens x the ``G`` query heads of one KV head: the
``BLOCK_M = BLOCK_Q * GROUP_PAD`` rows (token-major, head-minor) share every K/V tile load.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from backend.attention.kernels.common import (
    check_cache_layout,
    check_scales,
    dot_precision,
    next_pow2,
    padded_dim,
    softmax_scale_log2,
    window_arg,
)
from backend.attention.kernels.online_softmax import attend_kv_block


@triton.jit
def _prefill_kernel(
    out_ptr,                     # [num_tokens, num_heads, head_dim]
    q_ptr,                       # [num_tokens, num_heads, head_dim]
    k_cache_ptr, v_cache_ptr,    # [num_blocks, block_size, num_kv_heads, head_dim]
    k_scale_ptr, v_scale_ptr,    # [num_blocks, block_size, num_kv_heads] fp16 (QUANT; else unused)
    block_tables_ptr,            # [num_seqs, max_blocks] int32
    seq_lens_ptr,                # [num_seqs] int32
    query_start_loc_ptr,         # [num_seqs + 1] int32
    scale_log2,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_ct, stride_ch, stride_bt, stride_sb, stride_st,
    window,                      # sliding window: keys q_pos - window < k <= q_pos; NO_WINDOW: none
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    PRECISION: tl.constexpr, HAS_WINDOW: tl.constexpr, QUANT: tl.constexpr,
):
    seq = tl.program_id(0)
    q_blk = tl.program_id(1)
    kvh = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_blk * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_len = seq_len - q_len

    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_t = tl.arange(0, BLOCK_SIZE)
    qi = q_blk * BLOCK_Q + offs_m // GROUP_PAD          # [BLOCK_M] query index within the sequence
    g = offs_m % GROUP_PAD
    heads = kvh * GROUP + g
    row_mask = (qi < q_len) & (g < GROUP)
    d_mask = offs_d < HEAD_DIM
    q_pos = ctx_len + qi                                 # [BLOCK_M] position of each row's token
    tok = (q_start + qi).to(tl.int64)
    q = tl.load(q_ptr + tok[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_M, HEAD_DIM_PAD]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    kv_end = tl.minimum(seq_len, ctx_len + (q_blk + 1) * BLOCK_Q)  # last key any row here may see, +1
    kv_start = tl.maximum(ctx_len + q_blk * BLOCK_Q - window + 1, 0)  # first key the first row here may see
    for blk in range(kv_start // BLOCK_SIZE, tl.cdiv(kv_end, BLOCK_SIZE)):
        phys = tl.load(block_tables_ptr + seq * stride_bt + blk).to(tl.int64)
        k_pos = blk * BLOCK_SIZE + offs_t                            # [BLOCK_SIZE]
        t_mask = k_pos < kv_end
        kv_off = phys * stride_cb + offs_t[:, None] * stride_ct + kvh * stride_ch + offs_d[None, :]
        kv_mask = t_mask[:, None] & d_mask[None, :]
        visible = (k_pos[None, :] <= q_pos[:, None]) & t_mask[None, :]
        if HAS_WINDOW:
            visible = visible & (k_pos[None, :] > q_pos[:, None] - window)
        # without a window every row (padding rows too) sees key 0, so the running max is finite from the
        # first block on; with one, a later row's window may start after this block (ROWS_MAY_BE_EMPTY)
        s_off = phys * stride_sb + offs_t * stride_st + kvh
        m_i, l_i, acc = attend_kv_block(q, k_cache_ptr, v_cache_ptr, kv_off, kv_mask, visible,
                                        m_i, l_i, acc, scale_log2, k_scale_ptr, v_scale_ptr, s_off, t_mask,
                                        PRECISION, HAS_WINDOW, QUANT)

    out = acc / l_i[:, None]
    tl.store(out_ptr + tok[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])


def query_block(group: int, block_m: int) -> tuple[int, int]:
    """``(BLOCK_Q, GROUP_PAD)``: query tokens per program and padded group, with ``BLOCK_M >= 16``."""
    group_pad = next_pow2(group)
    block_q = max(1, block_m // group_pad, -(-16 // group_pad))
    return block_q, group_pad


def paged_prefill_attention(
    q: torch.Tensor,                # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,          # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,          # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,     # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,         # [num_seqs] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    max_query_len: int,
    scale: float | None = None,
    block_m: int = 64,              # rows (query tokens x padded group) per program
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]
    window: int | None = None,      # sliding window of this layer (backend/attention/window.py)
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] fp16: an int8/fp8 cache
    v_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] fp16
) -> torch.Tensor:                  # [num_tokens, num_heads, head_dim]
    check_cache_layout(k_cache, v_cache)
    quant = check_scales(k_cache, k_scale, v_scale)
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    block_q, group_pad = query_block(group, block_m)
    num_seqs = seq_lens.shape[0]
    if out is None:
        out = torch.empty_like(q)
    grid = (num_seqs, -(-max_query_len // block_q), num_kv_heads)
    _prefill_kernel[grid](
        out, q, k_cache, v_cache, k_scale if quant else k_cache,
        v_scale if quant else v_cache, block_tables, seq_lens, query_start_loc,
        softmax_scale_log2(head_dim, scale),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        k_scale.stride(0) if quant else 0, k_scale.stride(1) if quant else 0, window_arg(window),
        GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q, HEAD_DIM=head_dim, HEAD_DIM_PAD=padded_dim(head_dim),
        BLOCK_SIZE=block_size, PRECISION=dot_precision(q.dtype), HAS_WINDOW=window is not None,
        QUANT=quant,
    )
    return out
