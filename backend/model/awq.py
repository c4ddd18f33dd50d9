"""AWQ checkpoints (``quantization_config.quant_method == "awq"``, AutoAWQ's GEMM layout) onto our int4 format.

A projection ``P`` is stored as ``P.qweight`` int32 [in, out / 8] and ``P.qzeros`` int32 [groups, out / 8],
both packed along the output in AWQ's interleaved order (nibble ``i`` of word ``c`` holds output column
``8 c + AWQ_ORDER[i]``), and ``P.scales`` fp16 [groups, out]: ``w[o, i] = (n[i, o] - zero[g, o]) * scale[g, o]``
with ``g = i // group_size`` (no offset on the zeros). Mapped exactly onto our int4 with per-group zero
points. Refused naming the file and field: bits other than 4, a ``version`` other than "gemm" (GEMV and
Marlin layouts), ``zero_point`` false, a group size that does not divide a layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from backend.model.config import CheckpointError
from backend.model.prequantized import checkpoint_parts, concat_out, pack_cols, unpack_cols
from backend.model.quant import QuantizedWeight
from backend.model.quant_pack import pack_int4

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass(frozen=True)
class AwqConfig:
    group_size: int
    source: str            # the file the config came from

    @classmethod
    def parse(cls, q: dict, source: str) -> AwqConfig:
        bits, group = q.get("bits", q.get("w_bit")), q.get("group_size", q.get("q_group_size"))
        if bits != 4 or isinstance(bits, bool):
            raise CheckpointError(f"{source}: quantization_config.bits {bits!r} is not supported for awq (4)")
        if isinstance(group, bool) or not isinstance(group, int) or group <= 0:
            raise CheckpointError(f"{source}: quantization_config.group_size must be a positive integer, got {group!r}")
        version = str(q.get("version", "gemm")).lower()
        if version != "gemm":
            raise CheckpointError(f"{source}: quantization_config.version {q.get('version')!r} is not supported "
                                  "(awq: gemm)")
        if not q.get("zero_point", True):
            raise CheckpointError(f"{source}: quantization_config.zero_point false is not supported (awq)")
        return cls(group, source)

    def tensor_shapes(self, shapes: dict[str, tuple[int, ...]]) -> tuple[dict, set]:
        """Replace each projection ``*_proj.weight`` [out, in] by its AWQ tensors; -> (shapes, optional names)."""
        out_shapes = {}
        for name, shape in shapes.items():
            if not (name.endswith("_proj.weight") and name.startswith("model.layers.")):
                out_shapes[name] = shape
                continue
            (out_f, in_f), base = shape, name[:-len("weight")]
            if in_f % self.group_size or out_f % 8:
                raise CheckpointError(f"{self.source}: quantization_config.group_size {self.group_size} does not "
                                      f"divide {name[:-len('.weight')]}'s {in_f} input features (or its {out_f} "
                                      "outputs are not a multiple of 8)")
            groups = in_f // self.group_size
            out_shapes.update({base + "qweight": (in_f, out_f // 8), base + "qzeros": (groups, out_f // 8),
                               base + "scales": (groups, out_f)})
        return out_shapes, set()

    def weights(self, num_layers: int, hf: dict[str, torch.Tensor]) -> dict[str, QuantizedWeight]:
        """Our fused projections (``layers.{i}.self_attn.qkv_proj`` ...) from the checkpoint's AWQ tensors."""
        return {f"layers.{i}.{ours}": concat_out([self.layer(hf, f"model.layers.{i}.{name}.") for name in names])
                for i in range(num_layers) for ours, names in checkpoint_parts(hf, i).items()}

    def layer(self, hf: dict[str, torch.Tensor], base: str) -> QuantizedWeight:
        for suffix in ("qweight", "qzeros"):
            if hf[base + suffix].dtype != torch.int32:
                raise CheckpointError(f"{self.source}: tensor {base + suffix!r} is {hf[base + suffix].dtype}, "
                                      "expected torch.int32")
        n = unpack_awq(hf[base + "qweight"])                                   # [in, out]
        zeros = unpack_awq(hf[base + "qzeros"])                                # [groups, out]
        return QuantizedWeight("int4", pack_int4(n.t()), hf[base + "scales"].float().t().contiguous(),
                               self.group_size, zeros.t().float().contiguous(), f"AWQ 4-bit, {self.source}")


def read_awq_config(folder: Path, raw: dict) -> AwqConfig | None:
    """The checkpoint's AWQ settings (``config.json``'s quantization_config with quant_method "awq"), else None."""
    q = raw.get("quantization_config")
    if isinstance(q, dict) and q.get("quant_method") == "awq":
        return AwqConfig.parse(q, str(folder / "config.json"))
    return None


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:  # int32 [r, c / 8] -> [r, c] in [0, 15], natural order
    seq = unpack_cols(packed, 4)                                               # nibble i at column 8 c + i
    natural = torch.empty_like(seq)
    for i, col in enumerate(AWQ_ORDER):
        natural[:, col::8] = seq[:, i::8]
    return natural


def pack_awq(values: torch.Tensor) -> torch.Tensor:  # [r, c] in [0, 15] -> int32 [r, c / 8], AWQ's order
    seq = torch.empty_like(values)
    for i, col in enumerate(AWQ_ORDER):
        seq[:, i::8] = values[:, col::8]
    return pack_cols(seq, 4)
