"""The attention-backend interface the model calls once per layer."""
from __future__ import annotations

import abc

import torch

from backend.attention.metadata import AttentionMetadata


class AttentionBackend(abc.ABC):
    """Computes attention for every token of a step, and owns how K/V are stored.

    The runner calls ``prepare(metadata)`` once per step; the model then calls ``forward``
    once per layer. ``q/k/v`` are already rotated. Anything shared by the layers of a step
    (gather indices, masks, kernel launch parameters) belongs in ``prepare``.
    """

    @abc.abstractmethod
    def prepare(self, metadata: AttentionMetadata) -> None:
        """Take this step's metadata; precompute what every layer shares."""

    @abc.abstractmethod
    def forward(
        self,
        layer_idx: int,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    ) -> torch.Tensor:    # [num_tokens, num_heads, head_dim]
        ...
