"""Attention backends: one interface, a torch path (CPU, reference) and Triton kernels (GPU).

The Triton backend is imported lazily (``make_attention_backend``) so that CPU-only
installs never import ``triton``.
"""
from .base import AttentionBackend
from .dense import DenseCausalAttention
from .metadata import AttentionMetadata, build_attention_metadata
from .selector import make_attention_backend
from .torch_paged import TorchPagedAttention

__all__ = ["AttentionBackend", "AttentionMetadata", "DenseCausalAttention", "TorchPagedAttention",
           "build_attention_metadata", "make_attention_backend"]
