"""The grammar bitmask on logits rows: the native ops of ``backend/native/csrc/bitmask.cpp`` (one call, no
temporaries) where the engine runs its native step, torch's ops (``ops.apply_token_bitmask``) elsewhere.

Both give the same result: ``masked_copy`` is a float32 copy of the logits with disallowed tokens at ``-inf``;
``masked_argmax`` is the argmax of the masked rows without writing them (greedy guided rows need nothing else).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from backend.sampling.ops import apply_token_bitmask

NATIVE_OPS = ("masked_logits", "masked_argmax", "forced_tokens")


@dataclass(frozen=True)
class BitmaskKernels:
    native: Any | None = None   # torch.ops.triton_llm holding NATIVE_OPS; None: torch ops only

    @classmethod
    def of(cls, ops: Any | None) -> BitmaskKernels:
        """Native kernels when ``ops`` (a ``native_ops().ops``) has them, else the torch ones."""
        return cls(ops if ops is not None and all(hasattr(ops, name) for name in NATIVE_OPS) else None)

    def _native_for(self, logits: torch.Tensor, bitmask: torch.Tensor) -> bool:
        return (self.native is not None and logits.is_cpu and logits.dtype == torch.float32
                and logits.stride(-1) == 1 and bitmask.stride(-1) == 1)

    def masked_copy(
        self,
        logits: torch.Tensor,   # [num_rows, vocab] (not modified)
        bitmask: torch.Tensor,  # [num_rows, ceil(vocab / 32)] int32
    ) -> torch.Tensor:          # [num_rows, vocab] fp32, a new tensor
        """A float32 copy of ``logits`` with ``-inf`` at the tokens the mask forbids (the sampler's copy and
        the mask in one native call)."""
        if self._native_for(logits, bitmask):
            return self.native.masked_logits(logits, bitmask)
        return apply_token_bitmask(logits.to(torch.float32, copy=True), bitmask)

    def masked_argmax(
        self,
        logits: torch.Tensor,   # [num_rows, vocab] (not modified)
        bitmask: torch.Tensor,  # [num_rows, ceil(vocab / 32)] int32
    ) -> torch.Tensor:          # [num_rows] int64
        if self._native_for(logits, bitmask):
            return self.native.masked_argmax(logits, bitmask)
        return apply_token_bitmask(logits.to(torch.float32, copy=True), bitmask).argmax(dim=-1)

    def all_forced(
        self,
        bitmask: torch.Tensor,  # [num_rows, ceil(vocab / 32)] int32
        vocab: int,
    ) -> list[int] | None:      # [num_rows]: the one token each row allows
        """The one token each row allows, when every row allows exactly one below ``vocab``; None when a row allows
        several or none, and without the native kernel (unpacking the bits with torch ops costs more than the draws
        a forced step saves; tests compare the kernel with ``unpack_bitmask``)."""
        if self.native is None or not bitmask.is_cpu or bitmask.stride(-1) != 1:
            return None
        forced = self.native.forced_tokens(bitmask, vocab).tolist()   # the kernel's -1: several or none
        return forced if min(forced, default=-1) >= 0 else None

TORCH_KERNELS = BitmaskKernels()
