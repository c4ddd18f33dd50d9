"""What a decoder layer's projections offer a step's adapters: an additive delta after each projection.

The model layer owns this hook, and adapters (``backend/lora/``) implement it, so the model imports nothing of
theirs. A decoder calls ``delta.add(layer, proj, x, y)`` right after projection ``proj`` of layer ``layer``
computed ``y`` from ``x``; the projections, in the model's (and the native op's) order: ``QKV``, ``O``, ``GATE_UP``,
``DOWN`` (fused q/k/v and gate/up, as the eager model holds them).
"""
from __future__ import annotations

from typing import Protocol

import torch

QKV, O, GATE_UP, DOWN = range(4)


class ProjectionDelta(Protocol):
    def add(self, layer: int, proj: int,
            x: torch.Tensor,       # [T, K] the projection's input
            y: torch.Tensor,       # [T, N] its output, updated in place
            ) -> None: ...
