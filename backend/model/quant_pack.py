"""The maths of our quantized weight formats: quantize, pack and dequantize (pure functions).

- int8: ``w[o, i] = q[o, i] * scale[o, i // group]``, ``q`` int8 [out, in]; per output channel when
  quantized at load (one group spanning the row), grouped when a GPTQ checkpoint says so.
- int4: ``w[o, i] = (n[o, i] - zero[o, g]) * scale[o, g]`` with ``g = i // group``, ``n`` in [0, 15] packed two
  per byte, ``zero`` 8 when symmetric (``zeros`` None) or per group (asymmetric GPTQ). Packing works in
  blocks of ``int4_block(in)`` columns: byte ``j`` of a block holds column ``j`` in the low nibble and column
  ``j + block / 2`` in the high one. Blocks of 32 let the native kernel expand 32 weights with one 16-byte
  load; layers whose width is not a multiple of 32 use blocks of 2 (adjacent pairs).
- fp8: e4m3 per output channel (``|q| <= 448``).
"""
from __future__ import annotations

import torch

FP8_MAX = 448.0
INT4_BLOCK = 32


def int4_block(in_features: int) -> int:
    """Columns per packed int4 block for a layer of this width."""
    return INT4_BLOCK if in_features % INT4_BLOCK == 0 else 2


def pack_int4(n: torch.Tensor) -> torch.Tensor:  # n [out, in] integers in [0, 15] -> [out, in / 2] uint8
    out_f, in_f = n.shape
    b = n.to(torch.uint8).reshape(out_f, in_f // int4_block(in_f), 2, int4_block(in_f) // 2)
    return (b[:, :, 0] | (b[:, :, 1] << 4)).reshape(out_f, in_f // 2).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:  # [out, in / 2] uint8 -> n [out, in] uint8 in [0, 15]
    out_f, half = packed.shape
    block = int4_block(2 * half)
    p = packed.reshape(out_f, 2 * half // block, 1, block // 2)
    return torch.cat([p & 0xF, p >> 4], dim=2).reshape(out_f, 2 * half)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # w [out, in] -> (q int8, scale [out])
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    return torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale


def quantize_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per group -> (packed uint8 [out, in / 2], scale [out, in / group])."""
    out_f, in_f = w.shape
    g = w.reshape(out_f, in_f // group, group)
    scale = g.abs().amax(dim=2).clamp(min=1e-12) / 7.0
    q = torch.round(g / scale[:, :, None]).clamp_(-8, 7).reshape(out_f, in_f) + 8
    return pack_int4(q), scale


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX
    return (w / scale[:, None]).to(torch.float8_e4m3fn), scale


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, out: torch.Tensor,
                    zeros: torch.Tensor | None = None) -> torch.Tensor:
    """Unpack into ``out`` [out_features, in_features] (the compute dtype); ``scale``/``zeros`` [out, groups]."""
    o, half = packed.shape
    block = int4_block(2 * half)
    q = out.view(o, 2 * half // block, 2, block // 2)
    p = packed.view(o, 2 * half // block, block // 2)
    q[:, :, 0].copy_(p & 0xF)
    q[:, :, 1].copy_(p >> 4)
    groups = out.view(o, scale.shape[1], -1)
    if zeros is None:
        out.sub_(8.0)
    else:
        groups.sub_(zeros[:, :, None])
    groups.mul_(scale[:, :, None])
    return out


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``q`` [out, in] int8, ``scale`` [out, groups] -> ``out`` [out, in] (the compute dtype)."""
    out.copy_(q)
    out.view(q.shape[0], scale.shape[1], -1).mul_(scale[:, :, None])
    return out
