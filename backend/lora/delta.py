"""The LoRA delta of a mixed batch: each token's rows through its own adapter, tokens without one untouched.

``y [T, N] += B[s] (A[s] x)`` for each token of slot ``s``: a gathered shrink ``[T_s, K] -> [T_s, R]`` and expand
``[T_s, R] -> [T_s, N]`` per slot present (Punica's SGMV: the tokens of one adapter as one segment). ``LoraBatch``
holds a step's segments, computed once and used by every layer and projection.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.lora.stacked import StackedLoraWeights


def lora_delta_reference(x: torch.Tensor,       # [T, K]
                         a: torch.Tensor,       # [S, R, K]
                         b: torch.Tensor,       # [S, N, R]
                         slots: torch.Tensor,   # [T] int, -1: no adapter
                         ) -> torch.Tensor:     # [T, N]
    """Token by token, in float64: what every delta implementation must equal."""
    out = torch.zeros(x.shape[0], b.shape[1], dtype=torch.float64)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            out[t] = b[s].double() @ (a[s].double() @ x[t].double())
    return out


def segments(slots: list[int], device: torch.device | str = "cpu") -> list[tuple[int, torch.Tensor | None]]:
    """(slot, token indices [T_s] int64 on ``device``) per slot present; indices None when one slot covers every
    token."""
    present = sorted({s for s in slots if s >= 0})
    if len(present) == 1 and len(slots) and all(s == present[0] for s in slots):
        return [(present[0], None)]
    t = torch.tensor(slots)
    return [(s, (t == s).nonzero().flatten().to(device)) for s in present]


@dataclass(frozen=True)
class LoraBatch:
    """One step's adapters: the resident stacks, each token's slot, and the per-slot token segments."""

    weights: StackedLoraWeights
    slots: torch.Tensor                                  # [T] int32, -1: no adapter (on the weights' device)
    segments: list[tuple[int, torch.Tensor | None]]

    @classmethod
    def of(cls, weights: StackedLoraWeights, token_slots: list[int]) -> LoraBatch | None:
        """None when no token has an adapter (the step runs as the base model)."""
        if all(s < 0 for s in token_slots):
            return None
        device = weights.device
        slots = torch.tensor(token_slots, dtype=torch.int32)
        if device.type != "cpu":
            slots = slots.to(device, non_blocking=True)
        return cls(weights, slots, [] if weights.kernel is not None else segments(token_slots, device))

    def add(self, layer: int, proj: int,
            x: torch.Tensor,       # [T, K] the projection's input
            y: torch.Tensor,       # [T, N] its output, updated in place
            ) -> None:
        a, b, active = self.weights.a[layer][proj], self.weights.b[layer][proj], self.weights.active
        if self.weights.kernel is not None:                 # CUDA: the Triton kernels (triton_delta.py)
            self.weights.kernel(x, y, a, b, self.slots)
            return
        for s, idx in self.segments:
            if not active[s][layer][proj]:
                continue
            if idx is None:
                y.addmm_(x @ a[s].t(), b[s].t())
            else:
                y.index_add_(0, idx, (x.index_select(0, idx) @ a[s].t()) @ b[s].t())
