"""GPTQ checkpoints (``quantization_config.quant_method == "gptq"``) mapped onto our int4 / int8 formats.

A GPTQ linear layer ``P`` is stored as ``P.qweight`` int32 [in * bits / 32, out] (``32 / bits`` input rows
per word, the first in the lowest bits), ``P.qzeros`` int32 [groups, out * bits / 32] (packed the same way
along the output), ``P.scales`` fp16 [groups, out] and ``P.g_idx`` int32 [in] (the group of each input
column): ``w[o, i] = (n[i, o] - zero[g, o]) * scale[g, o]`` with ``g = g_idx[i]``. The original format
(``checkpoint_format`` "gptq", v1) stores ``zero - 1``; "gptq_v2" stores the zero itself.

Mapping (exact: the dequantized weights equal GPTQ's own dequantization):
- 4 bits -> our int4 with per-group zero points (None when every zero is 8, the symmetric case);
- 8 bits -> our int8 with per-group scales, ``q = n - 128``; only symmetric checkpoints (every zero 128).
Refused with the file and field named: another ``quant_method`` (bitsandbytes, ...; AWQ: awq.py), other bit
widths, a group size that does not divide a layer, a quantized ``lm_head``, and act-order checkpoints
whose ``g_idx`` is not the plain grouping ``i // group_size`` (their columns would need reordering).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from backend.model.config import CheckpointError
from backend.model.prequantized import checkpoint_parts, concat_out, unpack_cols, unpack_rows
from backend.model.quant import QuantizedWeight
from backend.model.quant_pack import pack_int4

GPTQ_BITS = (4, 8)
FORMATS = {"gptq": 1, "gptq_v2": 0}    # checkpoint_format -> offset added to the stored zero points


@dataclass(frozen=True)
class GptqConfig:
    bits: int
    group_size: int        # -1: one group per row
    sym: bool
    desc_act: bool
    zero_offset: int       # added to stored zero points (1 for the v1 "gptq" format)
    source: str            # the file the config came from

    @classmethod
    def parse(cls, q: object, source: str) -> GptqConfig:
        if not isinstance(q, dict):
            raise CheckpointError(f"{source}: quantization_config must be an object, got {q!r}")
        method = q.get("quant_method", "gptq" if source.endswith("quantize_config.json") else None)
        if method != "gptq":
            raise CheckpointError(f"{source}: quantization_config.quant_method {method!r} is not supported "
                                  "(pre-quantized checkpoints: gptq, awq); use a float16 / bfloat16 / float32 "
                                  "checkpoint and the quantization parameter")
        bits, group = q.get("bits"), q.get("group_size", -1)
        if bits not in GPTQ_BITS or isinstance(bits, bool):
            raise CheckpointError(f"{source}: quantization_config.bits {bits!r} is not supported (4 or 8)")
        if isinstance(group, bool) or not isinstance(group, int) or not (group == -1 or group > 0):
            raise CheckpointError(f"{source}: quantization_config.group_size must be -1 or a positive integer, "
                                  f"got {group!r}")
        fmt = q.get("checkpoint_format", "gptq")
        if fmt not in FORMATS:
            raise CheckpointError(f"{source}: quantization_config.checkpoint_format {fmt!r} is not supported "
                                  f"({' or '.join(FORMATS)})")
        if q.get("lm_head"):
            raise CheckpointError(f"{source}: quantization_config.lm_head true (a quantized LM head) is not supported")
        return cls(bits, group, bool(q.get("sym", True)), bool(q.get("desc_act", False)), FORMATS[fmt], source)

    def group_for(self, in_features: int) -> int:
        return in_features if self.group_size == -1 else self.group_size

    def tensor_shapes(self, shapes: dict[str, tuple[int, ...]]) -> tuple[dict, set]:
        return gptq_tensor_shapes(shapes, self)

    def weights(self, num_layers: int, hf: dict[str, torch.Tensor]) -> dict[str, QuantizedWeight]:
        return gptq_weights(num_layers, hf, self)


def read_gptq_config(folder: Path, raw: dict) -> GptqConfig | None:
    """The checkpoint's GPTQ settings: ``config.json``'s quantization_config, else AutoGPTQ's
    ``quantize_config.json``; None without either. Another ``quant_method`` is refused naming it (the
    loader asks ``read_awq_config`` first)."""
    q = raw.get("quantization_config")
    if q:
        return GptqConfig.parse(q, str(folder / "config.json"))
    legacy = folder / "quantize_config.json"
    if legacy.is_file():
        try:
            q = json.loads(legacy.read_text())
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{legacy}: not valid JSON ({e})") from e
        return GptqConfig.parse(q, str(legacy))
    return None


def gptq_tensor_shapes(shapes: dict[str, tuple[int, ...]], gcfg: GptqConfig) -> tuple[dict, set]:
    """Replace each projection ``*_proj.weight`` [out, in] of ``shapes`` by its GPTQ tensors; -> (shapes, optional)."""
    out_shapes, optional = {}, set()
    per = 32 // gcfg.bits
    for name, shape in shapes.items():
        if not (name.endswith("_proj.weight") and name.startswith("model.layers.")):
            out_shapes[name] = shape
            continue
        out_f, in_f = shape
        base, group = name[:-len("weight")], gcfg.group_for(in_f)
        if in_f % group:
            raise CheckpointError(f"{gcfg.source}: quantization_config.group_size {group} does not divide "
                                  f"{name[:-len('.weight')]}'s {in_f} input features")
        if in_f % per or out_f % per:
            raise CheckpointError(f"{gcfg.source}: {name[:-len('.weight')]} is {out_f} x {in_f}: GPTQ packs "
                                  f"{per} values per int32 along both dimensions")
        out_shapes.update({base + "qweight": (in_f // per, out_f), base + "qzeros": (in_f // group, out_f // per),
                           base + "scales": (in_f // group, out_f), base + "g_idx": (in_f,)})
        optional.add(base + "g_idx")
    return out_shapes, optional


def gptq_layer(hf: dict[str, torch.Tensor], base: str, gcfg: GptqConfig) -> QuantizedWeight:
    """One GPTQ layer (``base`` = "model.layers.0.self_attn.q_proj.") in our format."""
    for suffix in ("qweight", "qzeros"):
        if hf[base + suffix].dtype != torch.int32:
            raise CheckpointError(f"{gcfg.source}: tensor {base + suffix!r} is {hf[base + suffix].dtype}, "
                                  "expected torch.int32")
    n = unpack_rows(hf[base + "qweight"], gcfg.bits)                                  # [in, out]
    zeros = unpack_cols(hf[base + "qzeros"], gcfg.bits) + gcfg.zero_offset          # [groups, out]
    scales = hf[base + "scales"].float()                                            # [groups, out]
    in_f = n.shape[0]
    group = in_f // scales.shape[0]
    g_idx = hf.get(base + "g_idx")
    if g_idx is not None and not torch.equal(g_idx.long(), torch.arange(in_f) // group):
        raise CheckpointError(f"{gcfg.source}: tensor {base}g_idx is not the plain grouping i // {group} "
                              "(desc_act / act-order reordering): not supported")
    if g_idx is None and gcfg.desc_act:
        raise CheckpointError(f"{gcfg.source}: quantization_config.desc_act true without a {base}g_idx tensor")
    origin = f"GPTQ {gcfg.bits}-bit, {gcfg.source}"
    if gcfg.bits == 4:
        z = None if bool((zeros == 8).all()) else zeros.t().float().contiguous()
        return QuantizedWeight("int4", pack_int4(n.t()), scales.t().contiguous(), group, z, origin)
    if not bool((zeros == 128).all()):
        raise CheckpointError(f"{gcfg.source}: {base}qzeros: 8-bit layers with zero points other than 128 "
                              "(sym false) are not supported")
    return QuantizedWeight("int8", (n.t() - 128).to(torch.int8).contiguous(), scales.t().contiguous(), group,
                           origin=origin)


def gptq_weights(num_layers: int, hf: dict[str, torch.Tensor], gcfg: GptqConfig) -> dict[str, QuantizedWeight]:
    """Our fused projections (``layers.{i}.self_attn.qkv_proj`` ...) from the checkpoint's GPTQ tensors."""
    return {f"layers.{i}.{ours}": concat_out([gptq_layer(hf, f"model.layers.{i}.{name}.", gcfg) for name in names])
            for i in range(num_layers) for ours, names in checkpoint_parts(hf, i).items()}
