"""The attention kernels' shared inner step: one KV block folded into a running softmax."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attend_kv_block(q, k_cache_ptr, v_cache_ptr, kv_off, kv_mask, visible, m_i, l_i, acc, scale_log2,
                    PRECISION: tl.constexpr, ROWS_MAY_BE_EMPTY: tl.constexpr = False):
    """Fold one block of keys/values into the running (max, sum, output) of the query rows.

    q: [ROWS, HEAD_DIM_PAD]; kv_off/kv_mask: [BLOCK_SIZE, HEAD_DIM_PAD]; visible: [ROWS, BLOCK_SIZE]
    (or broadcastable) bool; m_i, l_i: [ROWS] fp32 in log2 units; acc: [ROWS, HEAD_DIM_PAD] fp32.
    ``ROWS_MAY_BE_EMPTY``: a row may have seen no key yet (a sliding window that starts after this
    block); its max stays -inf and it contributes nothing, instead of exp2(-inf - -inf) = NaN.
    """
    k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)                  # [BLOCK_SIZE, HEAD_DIM_PAD]
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2         # [ROWS, BLOCK_SIZE]
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = m_new
    if ROWS_MAY_BE_EMPTY:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc
