"""The attention kernels' shared inner step: one KV block folded into a running softmax."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_kv_tile(cache_ptr, scale_ptr, kv_off, kv_mask, s_off, s_mask, QUANT: tl.constexpr):
    """One block's keys (or values) ``[BLOCK_SIZE, HEAD_DIM_PAD]``; a quantized cache's codes times their
    per-token scales (``s_off``/``s_mask``: ``[BLOCK_SIZE]``), in fp32."""
    x = tl.load(cache_ptr + kv_off, mask=kv_mask, other=0.0)
    if QUANT:
        s = tl.load(scale_ptr + s_off, mask=s_mask, other=0.0).to(tl.float32)
        x = x.to(tl.float32) * s[:, None]
    return x


@triton.jit
def attend_kv_block(q, k_cache_ptr, v_cache_ptr, kv_off, kv_mask, visible, m_i, l_i, acc, scale_log2,
                    k_scale_ptr, v_scale_ptr, s_off, s_mask,
                    PRECISION: tl.constexpr, ROWS_MAY_BE_EMPTY: tl.constexpr, QUANT: tl.constexpr):
    """Fold one block of keys/values into the running (max, sum, output) of the query rows.

    q: [ROWS, HEAD_DIM_PAD]; kv_off/kv_mask: [BLOCK_SIZE, HEAD_DIM_PAD]; visible: [ROWS, BLOCK_SIZE]
    (or broadcastable) bool; m_i, l_i: [ROWS] fp32 in log2 units; acc: [ROWS, HEAD_DIM_PAD] fp32.
    ``ROWS_MAY_BE_EMPTY``: a row may have seen no key yet (a sliding window that starts after this
    block); its max stays -inf and it contributes nothing, instead of exp2(-inf - -inf) = NaN.
    ``QUANT``: the cache holds 8-bit codes with fp16 scales at ``k_scale_ptr``/``v_scale_ptr + s_off``
    (``[BLOCK_SIZE]``, masked by ``s_mask``), dequantized on load into q's dtype.
    """
    k = load_kv_tile(k_cache_ptr, k_scale_ptr, kv_off, kv_mask, s_off, s_mask, QUANT).to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2         # [ROWS, BLOCK_SIZE]
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = m_new
    if ROWS_MAY_BE_EMPTY:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = load_kv_tile(v_cache_ptr, v_scale_ptr, kv_off, kv_mask, s_off, s_mask, QUANT).to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc
