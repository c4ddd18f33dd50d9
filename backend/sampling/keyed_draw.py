"""Keyed draws: a sampled row's token as a pure function of its distribution and its key (docs/sampling.md).

A row's ``DrawKey`` is (seed, sequence index, output position). Two draw rules, one per engine configuration:
- ``DrawRule.INVERSE_CDF``: the first token, in id order, whose cumulative probability exceeds one keyed uniform
  (``NoiseStream.DRAW``); one uniform per row. Against a deterministic draft ``d`` (n-gram) the verifier couples by
  equality: ``d`` is accepted iff the draw equals it, and on rejection the draw itself is emitted.
- ``DrawRule.GUMBEL``: the exponential race ``argmax_v log(u_v) / p(v)`` over per-token keyed uniforms in id order
  (``NoiseStream.TOKEN``), which is Gumbel-max ``argmax log p + g``; a draft model proposes with the same noise
  over its own ``q``, so the verifier again couples by equality.
Either way the token at a position depends only on ``p`` there and the key, so speculation, batching, preemption
and the prefix cache change nothing when ``p`` is bit-identical. ``DrawKernels`` runs the native ops of
``backend/native/csrc/keyed_draw.cpp`` on the CPU, the torch reference (``keyed_noise`` + ``ops``) elsewhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from backend.sampling.keyed_noise import MASK32, NoiseStream, position_uniforms, token_uniforms
from backend.sampling.ops import cdf_draw, race_draw

NATIVE_OPS = ("keyed_cdf_draw", "keyed_race_draw", "keyed_uniforms")


class DrawRule(Enum):
    INVERSE_CDF = "inverse_cdf"   # without speculation, with n-gram drafts, with standard rejection sampling
    GUMBEL = "gumbel"             # with a draft model coupled by shared noise (``draft_coupling`` gumbel)

    @classmethod
    def of(cls, speculative_method: str, draft_coupling: str) -> DrawRule:
        """The engine configuration's one rule."""
        return cls.GUMBEL if speculative_method == "draft" and draft_coupling == "gumbel" else cls.INVERSE_CDF


@dataclass(frozen=True)
class DrawKeys:
    """The keys of a batch's rows."""

    seeds: list[int]          # [n] in [0, 2**64)
    seq_indices: list[int]    # [n] the sequence's index among its request's n
    positions: list[int]      # [n] the output position the row's token takes (0: the first generated token)

    def __len__(self) -> int:
        return len(self.seeds)

    def select(self, rows: list[int]) -> DrawKeys:
        return DrawKeys([self.seeds[i] for i in rows], [self.seq_indices[i] for i in rows],
                        [self.positions[i] for i in rows])

    def shifted(self, offsets: list[int]) -> DrawKeys:
        """The keys ``offsets[i]`` positions on (a verify step's rows after the drafts)."""
        return DrawKeys(self.seeds, self.seq_indices, [p + o for p, o in zip(self.positions, offsets)])

    def packed(self, device: torch.device | str = "cpu") -> torch.Tensor:   # -> [n, 4] int64
        """(seed low word, seed high word, sequence index, position): the native ops' layout."""
        return torch.tensor([[s & MASK32, s >> 32, i, p] for s, i, p in zip(self.seeds, self.seq_indices,
                                                                          self.positions)],
                            dtype=torch.int64, device=device).reshape(len(self), 4)


def keyed_uniforms_reference(keys: DrawKeys, stream: NoiseStream,
                             device: torch.device | str = "cpu") -> torch.Tensor:   # -> [n] float64
    packed = keys.packed(device)
    return position_uniforms(packed[:, :2], packed[:, 2], packed[:, 3], stream)


def keyed_draw_reference(probs: torch.Tensor,   # [n, vocab] >= 0
                         keys: DrawKeys,
                         rule: DrawRule,
                         stream: NoiseStream = NoiseStream.DRAW,
                         ) -> torch.Tensor:      # [n] int64
    """The draw in torch ops (any device)."""
    packed = keys.packed(probs.device)
    if rule is DrawRule.INVERSE_CDF:
        u = position_uniforms(packed[:, :2], packed[:, 2], packed[:, 3], stream)
        return cdf_draw(probs, u[:, None])
    return race_draw(probs, token_uniforms(packed[:, :2], packed[:, 2], packed[:, 3], probs.shape[-1]))


@dataclass(frozen=True)
class DrawKernels:
    native: Any | None = None   # torch.ops.triton_llm holding NATIVE_OPS; None: the torch reference only

    @classmethod
    def of(cls, ops: Any | None) -> DrawKernels:
        return cls(ops if ops is not None and all(hasattr(ops, name) for name in NATIVE_OPS) else None)

    @classmethod
    def for_device(cls, device: torch.device | str) -> DrawKernels:
        """The native draws on the CPU when the native library is built (``backend.native``), else torch's."""
        if torch.device(device).type != "cpu":
            return TORCH_DRAWS
        from backend.native import native_ops
        return cls.of(native_ops().ops)

    def draw(self, probs: torch.Tensor,   # [n, vocab] >= 0, unnormalised allowed
             keys: DrawKeys, rule: DrawRule, stream: NoiseStream = NoiseStream.DRAW,
             ) -> torch.Tensor:           # [n] int64
        if not len(keys):
            return torch.empty(0, dtype=torch.int64, device=probs.device)
        if self.native is not None and probs.is_cpu and probs.dtype == torch.float32 and probs.is_contiguous():
            packed = keys.packed()
            if rule is DrawRule.INVERSE_CDF:
                return self.native.keyed_cdf_draw(probs, packed, int(stream))
            return self.native.keyed_race_draw(probs, packed, int(NoiseStream.TOKEN))
        return keyed_draw_reference(probs, keys, rule, stream)

    def uniforms(self, keys: DrawKeys, stream: NoiseStream, device: torch.device | str = "cpu",
                 ) -> torch.Tensor:        # [n] float64 in (0, 1)
        if self.native is not None and torch.device(device).type == "cpu":
            return self.native.keyed_uniforms(keys.packed(), int(stream))
        return keyed_uniforms_reference(keys, stream, device)


TORCH_DRAWS = DrawKernels()
