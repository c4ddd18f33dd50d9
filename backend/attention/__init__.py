"""Attention backends: one interface, a torch path (CPU, reference) and Triton kernels (GPU).

The Triton backend is imported lazily (``make_attention_backend``) so that CPU-only
installs never import ``triton``.
"""
from backend.attention.base import AttentionBackend
from backend.attention.dense import DenseCausalAttention
from backend.attention.metadata import AttentionMetadata, build_attention_metadata
from backend.attention.selector import make_attention_backend
from backend.attention.torch_paged import TorchPagedAttention

__all__ = ["AttentionBackend", "AttentionMetadata", "DenseCausalAttention", "TorchPagedAttention",
           "build_attention_metadata", "make_attention_backend"]
