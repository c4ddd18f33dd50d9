"""Paged decode attention: one query token per sequence, GQA-aware, with split-K.

Each program handles one sequence x one KV head x its group of ``G`` query heads (the
group is the ``M`` side of the ``tl.dot``, so a K/V tile is loaded once for all ``G``
heads). With split-K (flash-decoding) the context is cut into partitions of
``blocks_per_partition`` cache blocks; each partition writes a normalised partial output
with its running max and exp-sum, and ``_reduce_kernel`` merges them. Softmax is in base 2
with the scale folded in (``scale * log2 e``).
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
def _decode_kernel(
    out_ptr,                     # [num_seqs, num_heads, head_dim]                 (SPLIT = False)
    part_out_ptr,                # [num_seqs, num_heads, max_parts, head_dim] fp32 (SPLIT = True)
    part_max_ptr, part_sum_ptr,  # [num_seqs, num_heads, max_parts] fp32          (SPLIT = True)
    q_ptr,                       # [num_seqs, num_heads, head_dim]
    k_cache_ptr, v_cache_ptr,    # [num_blocks, block_size, num_kv_heads, head_dim]
    k_scale_ptr, v_scale_ptr,    # [num_blocks, block_size, num_kv_heads] fp16 (QUANT; else unused)
    block_tables_ptr,            # [num_seqs, max_blocks] int32
    seq_lens_ptr,                # [num_seqs] int32
    scale_log2,
    stride_qs, stride_qh, stride_os, stride_oh,
    stride_cb, stride_ct, stride_ch, stride_bt, stride_sb, stride_st,
    max_parts, blocks_per_part,  # runtime ints: a new context length never recompiles
    window,                      # sliding window (keys seq_len - window .. seq_len - 1); NO_WINDOW: none
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    SPLIT: tl.constexpr, PRECISION: tl.constexpr, HAS_WINDOW: tl.constexpr, QUANT: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    part = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    first_blk = part * blocks_per_part
    if first_blk * BLOCK_SIZE >= seq_len:
        return  # partition past this sequence's end: the reduce ignores it
    last_blk = tl.minimum(first_blk + blocks_per_part, tl.cdiv(seq_len, BLOCK_SIZE))
    lo = tl.maximum(seq_len - window, 0)               # the first key inside the window (0: none)
    if last_blk * BLOCK_SIZE <= lo:
        return  # partition wholly before the window: the reduce ignores it
    first_blk = tl.maximum(first_blk, lo // BLOCK_SIZE)  # blocks before the window may be freed: never read

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_t = tl.arange(0, BLOCK_SIZE)
    heads = kvh * GROUP + offs_g
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)          # [GROUP_PAD, HEAD_DIM_PAD]

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    for blk in range(first_blk, last_blk):
        phys = tl.load(block_tables_ptr + seq * stride_bt + blk).to(tl.int64)
        t_mask = blk * BLOCK_SIZE + offs_t < seq_len
        if HAS_WINDOW:
            t_mask = t_mask & (blk * BLOCK_SIZE + offs_t >= lo)
        kv_off = phys * stride_cb + offs_t[:, None] * stride_ct + kvh * stride_ch + offs_d[None, :]
        kv_mask = t_mask[:, None] & d_mask[None, :]
        s_off = phys * stride_sb + offs_t * stride_st + kvh
        m_i, l_i, acc = attend_kv_block(q, k_cache_ptr, v_cache_ptr, kv_off, kv_mask, t_mask[None, :],
                                        m_i, l_i, acc, scale_log2, k_scale_ptr, v_scale_ptr, s_off, t_mask,
                                        PRECISION, False, QUANT)

    out = acc / l_i[:, None]
    out_mask = g_mask[:, None] & d_mask[None, :]
    if SPLIT:
        row = (seq * NUM_HEADS + heads) * max_parts + part                   # [GROUP_PAD]
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=out_mask)
        tl.store(part_max_ptr + row, m_i, mask=g_mask)
        tl.store(part_sum_ptr + row, l_i, mask=g_mask)
    else:
        tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _reduce_kernel(
    out_ptr,                     # [num_seqs, num_heads, head_dim]
    part_out_ptr,                # [num_seqs, num_heads, max_parts, head_dim] fp32
    part_max_ptr, part_sum_ptr,  # [num_seqs, num_heads, max_parts] fp32
    seq_lens_ptr,                # [num_seqs] int32
    stride_os, stride_oh, max_parts, part_tokens, window,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    PARTS_PAD: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    num_parts = tl.cdiv(seq_len, part_tokens)
    first_part = tl.maximum(seq_len - window, 0) // part_tokens   # earlier ones lie before the window
    offs_p = tl.arange(0, PARTS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    p_mask = (offs_p < num_parts) & (offs_p >= first_part)
    d_mask = offs_d < HEAD_DIM
    row = (seq * NUM_HEADS + head) * max_parts + offs_p                      # [PARTS_PAD]
    m = tl.load(part_max_ptr + row, mask=p_mask, other=float("-inf"))
    l = tl.load(part_sum_ptr + row, mask=p_mask, other=0.0)
    w = tl.exp2(m - tl.max(m, 0)) * l                                        # unnormalised partition weights
    w = w / tl.sum(w, 0)
    o = tl.load(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :],
                mask=p_mask[:, None] & d_mask[None, :], other=0.0)          # [PARTS_PAD, HEAD_DIM_PAD]
    out = tl.sum(o * w[:, None], 0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def num_partitions(max_seq_len: int, block_size: int, blocks_per_partition: int) -> int:
    return -(-max_seq_len // (block_size * blocks_per_partition))


def paged_decode_attention(
    q: torch.Tensor,             # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,       # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,       # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,      # [num_seqs] int32
    max_seq_len: int,
    scale: float | None = None,
    blocks_per_partition: int | None = None,  # None: no split (one partition covers any context)
    out: torch.Tensor | None = None,           # [num_seqs, num_heads, head_dim]
    window: int | None = None,                 # sliding window of this layer (backend/attention/window.py)
    k_scale: torch.Tensor | None = None,       # [num_blocks, block_size, num_kv_heads] fp16: an int8/fp8 cache
    v_scale: torch.Tensor | None = None,       # [num_blocks, block_size, num_kv_heads] fp16
) -> torch.Tensor:               # [num_seqs, num_heads, head_dim]
    check_cache_layout(k_cache, v_cache)
    quant = check_scales(k_cache, k_scale, v_scale)
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    max_blocks = -(-max_seq_len // block_size)
    bpp = max_blocks if blocks_per_partition is None else blocks_per_partition
    parts = num_partitions(max_seq_len, block_size, bpp)
    split = parts > 1
    f32 = dict(device=q.device, dtype=torch.float32)
    part_out = torch.empty(num_seqs, num_heads, parts, head_dim, **f32) if split else out
    part_max = torch.empty(num_seqs, num_heads, parts, **f32) if split else out
    part_sum = torch.empty(num_seqs, num_heads, parts, **f32) if split else out
    hd_pad = padded_dim(head_dim)
    _decode_kernel[(num_seqs, num_kv_heads, parts)](
        out, part_out, part_max, part_sum, q, k_cache, v_cache, k_scale if quant else k_cache,
        v_scale if quant else v_cache, block_tables, seq_lens,
        softmax_scale_log2(head_dim, scale),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        k_scale.stride(0) if quant else 0, k_scale.stride(1) if quant else 0,
        parts, bpp, window_arg(window),
        NUM_HEADS=num_heads, GROUP=group, GROUP_PAD=padded_dim(group), HEAD_DIM=head_dim, HEAD_DIM_PAD=hd_pad,
        BLOCK_SIZE=block_size, SPLIT=split, PRECISION=dot_precision(q.dtype), HAS_WINDOW=window is not None,
        QUANT=quant,
    )
    if split:
        _reduce_kernel[(num_seqs, num_heads)](
            out, part_out, part_max, part_sum, seq_lens, out.stride(0), out.stride(1), parts, block_size * bpp,
            window_arg(window),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, HEAD_DIM_PAD=hd_pad, PARTS_PAD=next_pow2(parts),
        )
    return out
