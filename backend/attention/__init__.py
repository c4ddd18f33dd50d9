"""Attention backends: one interface, a torch path (CPU, reference) and Triton kernels (GPU)."""
from .base import AttentionBackend
from .dense import DenseCausalAttention

__all__ = ["AttentionBackend", "DenseCausalAttention"]
