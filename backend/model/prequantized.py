"""What the pre-quantized checkpoint formats share (GPTQ: gptq.py, AWQ: awq.py).

``PrequantizedConfig``: a checkpoint's quantization settings, read from its config files, that say which
tensors the checkpoint holds instead of each projection's weight (``tensor_shapes``) and turn them into our
fused ``QuantizedWeight``s (``weights``). Both formats pack 4- or 8-bit values into int32 words (the first
value in the lowest bits): ``pack_rows`` / ``unpack_rows`` along the rows, ``*_cols`` along the columns.
"""
from __future__ import annotations

from typing import Protocol

import torch

from backend.model.config import CheckpointError
from backend.model.quant import QuantizedWeight

# our fused projection -> a split checkpoint's projections stacked along the output
PROJECTIONS = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
               "self_attn.o_proj": ("self_attn.o_proj",),
               "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
               "mlp.down_proj": ("mlp.down_proj",)}


def checkpoint_parts(hf: dict[str, torch.Tensor], layer: int) -> dict[str, tuple[str, ...]]:
    """Our fused projection -> the checkpoint's quantized projections stacked into it: the fused one itself where
    the checkpoint stores it so (Phi-3's ``qkv_proj`` / ``gate_up_proj``, as its family's declaration gave the
    expected tensors), else the split ones."""
    return {ours: (ours,) if f"model.layers.{layer}.{ours}.qweight" in hf else split
            for ours, split in PROJECTIONS.items()}


class PrequantizedConfig(Protocol):
    source: str            # the file the settings came from

    def tensor_shapes(self, shapes: dict[str, tuple[int, ...]]) -> tuple[dict, set]:
        """Each projection ``*_proj.weight`` [out, in] replaced by its quantized tensors; -> (shapes, optional)."""
        ...

    def weights(self, num_layers: int, hf: dict[str, torch.Tensor]) -> dict[str, QuantizedWeight]:
        """Our fused projections (``layers.{i}.self_attn.qkv_proj`` ...) from the checkpoint's tensors."""
        ...


def unpack_rows(packed: torch.Tensor, bits: int) -> torch.Tensor:  # int32 [n * bits / 32, m] -> [n, m] int32
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    v = (packed[:, None, :] >> shifts[None, :, None]) & ((1 << bits) - 1)
    return v.reshape(-1, packed.shape[1])


def unpack_cols(packed: torch.Tensor, bits: int) -> torch.Tensor:  # int32 [n, m * bits / 32] -> [n, m] int32
    return unpack_rows(packed.t().contiguous(), bits).t()


def pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:  # [n, m] in [0, 2^bits) -> int32 [n * bits / 32, m]
    per = 32 // bits
    v = values.to(torch.int64).reshape(-1, per, values.shape[1])
    word = (v << torch.arange(0, 32, bits, dtype=torch.int64)[None, :, None]).sum(1)
    return torch.where(word >= 1 << 31, word - (1 << 32), word).to(torch.int32)


def pack_cols(values: torch.Tensor, bits: int) -> torch.Tensor:  # [n, m] -> int32 [n, m * bits / 32]
    return pack_rows(values.t().contiguous(), bits).t().contiguous()


def concat_out(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """Stack layers along the output (q, k, v -> qkv_proj): same mode and group size."""
    first = parts[0]
    if len(parts) == 1:
        return first
    if any(p.group_size != first.group_size or p.mode != first.mode for p in parts):
        raise CheckpointError(f"{first.origin}: fused projections differ in format or group size")
    zeros = None
    if any(p.zeros is not None for p in parts):
        zeros = torch.cat([p.zeros if p.zeros is not None else torch.full_like(p.scale, 8.0) for p in parts])
    return QuantizedWeight(first.mode, torch.cat([p.qweight for p in parts]), torch.cat([p.scale for p in parts]),
                           first.group_size, zeros, first.origin)
