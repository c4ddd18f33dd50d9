"""The attention kernels' shared inner step: one KV block folded into a running softmax."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attend_kv_block(q, k_cache_ptr, v_cache_ptr, kv_off, kv_mask, visible, m_i, l_i, acc, scale_log2,
                    PRECISION: tl.constexpr):
    """Fold one block of keys/values into the running (max, sum, output) of the query rows.

    q: [ROWS, HEAD_DIM_PAD]; kv_off/kv_mask: [BLOCK_SIZE, HEAD_DIM_PAD]; visible: [ROWS, BLOCK_SIZE]
    (or broadcastable) bool; m_i, l_i: [ROWS] fp32 in log2 units; acc: [ROWS, HEAD_DIM_PAD] fp32.
    """
    k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)                  # [BLOCK_SIZE, HEAD_DIM_PAD]
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2         # [ROWS, BLOCK_SIZE]
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc
