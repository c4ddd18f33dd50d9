"""Causal attention over a dense batch of equal-length sequences, with no KV cache.

Used for training and as the simplest reference: the flat tokens are
``batch_size`` sequences of ``seq_len`` tokens each, laid end to end.
"""
from __future__ import annotations

import torch.nn.functional as F

from backend.attention.base import AttentionBackend
from backend.attention.window import dense_window_mask


class DenseCausalAttention(AttentionBackend):
    def __init__(self, batch_size: int, seq_len: int, windows=None, scale: float | None = None):
        """``windows``: per layer, a sliding window or None (backend/attention/window.py); ``scale``: of the scores
        (None: head_dim**-0.5)."""
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.windows = tuple(windows) if windows else ()
        self.scale = scale

    def prepare(self, metadata=None) -> None:
        """Nothing to precompute: the layout is fixed by ``batch_size`` and ``seq_len``."""

    def forward(self, layer_idx, q, k, v):
        b, s = self.batch_size, self.seq_len
        qh = q.view(b, s, *q.shape[1:]).transpose(1, 2)  # [b, heads, s, head_dim]
        kh = k.view(b, s, *k.shape[1:]).transpose(1, 2)  # [b, kv_heads, s, head_dim]
        vh = v.view(b, s, *v.shape[1:]).transpose(1, 2)
        window = self.windows[layer_idx] if self.windows else None
        mask = dense_window_mask(s, window, q.device)
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=mask is None, scale=self.scale,
                                             enable_gqa=qh.shape[1] != kh.shape[1])
        return out.transpose(1, 2).reshape(q.shape)
