"""Pick the attention backend for a KV cache: Triton kernels on CUDA, plain torch elsewhere."""
from __future__ import annotations

from backend.attention.base import AttentionBackend
from backend.attention.torch_paged import TorchPagedAttention
from backend.core.kv_cache import KVCache


def make_attention_backend(kv_cache: KVCache, scale: float | None = None, kind: str = "auto",
                           windows=None) -> AttentionBackend:
    """``kind``: ``auto`` (triton when the cache is on CUDA), ``torch`` or ``triton``.
    ``windows``: per layer, a sliding window or None (``backend/attention/window.py``)."""
    if kind not in ("auto", "torch", "triton"):
        raise ValueError(f"attention backend must be auto, torch or triton, got {kind!r}")
    if kind == "triton" or (kind == "auto" and kv_cache.device.type == "cuda"):
        from backend.attention.triton_paged import TritonPagedAttention  # imports triton: only when wanted
        return TritonPagedAttention(kv_cache, scale, windows=windows)
    return TorchPagedAttention(kv_cache, scale, windows=windows)
