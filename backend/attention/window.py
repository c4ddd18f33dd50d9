"""Sliding-window attention: which keys a query may see, per layer.

A layer with window ``W`` (HF's ``sliding_window``) lets the query at position ``p`` see the keys at
positions ``p - W < k <= p``: ``W`` keys, itself included (transformers' ``sliding_window_overlay``,
``kv_idx > q_idx - sliding_window``). ``None``: every key ``<= p``.

Windows are per layer (Qwen2 windows only the layers from ``max_window_layers`` on); the backends
take the tuple at construction and pick the layer's masks (torch) or window argument (kernels).
When every layer has a window, the K/V blocks wholly before the window of the next position a
sequence computes can never be read again: ``BlockManager.free_outside_window`` frees them and
leaves ``NULL_BLOCK`` in the block table (``build_attention_metadata`` maps it to block 0, which
the masks and the kernels' window never read).
"""
from __future__ import annotations

from typing import Sequence

import torch

Windows = tuple  # per layer: int (the window) or None (full causal attention)


def serving_windows(windows: Sequence[int | None], num_layers: int, max_model_len: int) -> Windows:
    """Per-layer windows for a context of ``max_model_len``: a window that cannot bind is dropped.

    ``windows`` is ``ModelConfig.sliding_windows`` (empty: no layer has one).
    """
    if not windows:
        return (None,) * num_layers
    if len(windows) != num_layers:
        raise ValueError(f"sliding windows: {len(windows)} entries for {num_layers} layers")
    return tuple(w if w is not None and w < max_model_len else None for w in windows)


def uniform_window(windows: Sequence[int | None]) -> int | None:
    """The window that bounds what EVERY layer reads (blocks before it can be freed); None if a layer has none."""
    if not windows or any(w is None for w in windows):
        return None
    return max(windows)


def decode_mask(seq_lens: torch.Tensor,  # [num_seqs] context length of each decode (its query is the last token)
                ctx_len: int,            # keys gathered per sequence
                window: int | None) -> torch.Tensor | None:  # [num_seqs, 1, 1, ctx_len] bool, or None: all
    """Which gathered keys each decode's one query sees (padding beyond its length, and before its window)."""
    b = seq_lens.shape[0]
    if window is None or int(seq_lens.max()) <= window:
        if b == 1:
            return None
        return (torch.arange(ctx_len, device=seq_lens.device)[None, :] < seq_lens[:, None])[:, None, None, :]
    k = torch.arange(ctx_len, device=seq_lens.device)[None, :]
    return ((k < seq_lens[:, None]) & (k >= seq_lens[:, None] - window))[:, None, None, :]


def causal_mask(query_len: int, seq_len: int, window: int | None,
                device: torch.device | str = "cpu") -> torch.Tensor | None:
    """``[query_len, seq_len]`` bool: the last ``query_len`` positions over all ``seq_len`` keys,
    causal and windowed; None when plain ``is_causal`` (query_len == seq_len, no binding window) is exact."""
    binding = window is not None and seq_len > window
    if query_len == seq_len and not binding:
        return None
    q = torch.arange(seq_len - query_len, seq_len, device=device)[:, None]
    k = torch.arange(seq_len, device=device)[None, :]
    return (k <= q) & (k > q - window) if binding else k <= q


def dense_window_mask(seq_len: int, window: int | None, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """Causal ``[seq_len, seq_len]`` mask with the window (None: plain causal)."""
    return causal_mask(seq_len, seq_len, window, device)
