"""``StackedLoraWeights``: the resident adapters' weights, one stack per layer and fused projection.

Projections in the model's (and the native op's) order: ``qkv``, ``o``, ``gate_up``, ``down``. Projection ``p`` of
layer ``l`` holds ``A [slots, R_p, K]`` and ``B [slots, N, R_p]`` with ``R_p = parts(p) * max_lora_rank``, its parts
the family's PEFT target modules in it (``layout.py``: q, k, v of qkv and gate, up of gate_up; one part where the
checkpoint fuses them, as Phi-3's ``qkv_proj`` and ``gate_up_proj``). Part ``j`` of an adapter of rank ``r`` fills
``A[s, j*R : j*R + r]`` and the block ``B[s, rows of part j, j*R : j*R + r]``; everything else stays zero, so
``y += B[s] (A[s] x)`` is exactly the sum of the parts' deltas (Punica's BGMV shapes: a shrink to ``R_p``, an
expand back to ``N``). ``active[s][l][p]`` says whether slot ``s`` has any part there (the eager path skips the
others).
"""
from __future__ import annotations

import torch

from backend.lora.adapter import LoraAdapter
from backend.lora.layout import PROJECTIONS, projection_layout
from backend.model.config import ModelConfig


class StackedLoraWeights:
    def __init__(self, cfg: ModelConfig, num_slots: int, max_rank: int, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32):
        """``dtype``: the model's compute dtype (the adapters' float32 weights are rounded to it once, here)."""
        self.num_slots, self.max_rank = num_slots, max_rank
        self.device = torch.device(device)
        self.kernel = None   # the delta as one call (x, y, A, B, slots) on CUDA (triton_delta.py), or torch segments
        self.num_layers = cfg.num_hidden_layers
        self.layout = projection_layout(cfg)
        self.a: list[list[torch.Tensor]] = []   # [layer][projection] -> [slots, R_p, K]
        self.b: list[list[torch.Tensor]] = []   # [layer][projection] -> [slots, N, R_p]
        for _ in range(self.num_layers):
            la, lb = [], []
            for p in PROJECTIONS:
                n, k, parts = self.layout[p]
                r = len(parts) * max_rank
                la.append(torch.zeros(num_slots, r, k, device=device, dtype=dtype))
                lb.append(torch.zeros(num_slots, n, r, device=device, dtype=dtype))
            self.a.append(la)
            self.b.append(lb)
        self.active = [[[False] * len(PROJECTIONS) for _ in range(self.num_layers)] for _ in range(num_slots)]
        # the native op's ``lora`` list: per layer, per projection, A then B (8 tensors a layer; updated in place)
        self.native_tensors = [t for la, lb in zip(self.a, self.b) for pair in zip(la, lb) for t in pair]

    def install(self, slot: int, adapter: LoraAdapter) -> None:
        """Write ``adapter`` into ``slot`` (what was there is cleared first)."""
        self.clear(slot)
        for l in range(self.num_layers):
            for pi, p in enumerate(PROJECTIONS):
                for j, (module, row0, rows) in enumerate(self.layout[p][2]):
                    part = adapter.parts.get((l, module))
                    if part is None:
                        continue
                    r, c0 = part.a.shape[0], j * self.max_rank
                    self.a[l][pi][slot, c0:c0 + r].copy_(part.a)
                    self.b[l][pi][slot, row0:row0 + rows, c0:c0 + r].copy_(part.b)
                    self.active[slot][l][pi] = True

    def clear(self, slot: int) -> None:
        for l in range(self.num_layers):
            for pi in range(len(PROJECTIONS)):
                if self.active[slot][l][pi]:
                    self.a[l][pi][slot].zero_()
                    self.b[l][pi][slot].zero_()
                    self.active[slot][l][pi] = False
