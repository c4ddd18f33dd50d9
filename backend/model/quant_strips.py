"""The weight layout of the native quantized GEMM (``backend/native/csrc/quant_gemm.h``): strips of 16 output rows.

The GEMM multiplies int8 or int4 weights with the activations quantized to int8 per token and block of 32 columns
(as llama.cpp's Q8_0), in integers (VNNI), with one float step per block; ``quant_gemm_reference`` is that maths in
float64. Packing (pure functions of our formats, ``quant_pack.py``), rows past ``n`` zero:
- int8 ``strips`` [S, K / 4, 16, 4] int8: element (s, k4, j, c) = q[16 s + j, 4 k4 + c]; ``aux`` the per-block
  weight sums times 128 (the kernel feeds the activations as unsigned bytes xq + 128), int32 [S, K / 32, 16];
- int4 ``strips`` [S, K / 8, 16, 4] uint8: byte (s, k8, j, c) = n[16 s + j, 8 k8 + c] | n[16 s + j, 8 k8 + 4 + c] << 4;
  ``aux`` the zero points (8 when symmetric) float [S, G, 16];
- ``scales`` [S, G, 16] float for both (G groups of a multiple of 32 columns; per output channel: G = 1).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.model.quant_pack import unpack_int4

STRIP = 16     # output rows per strip (one 16-lane vector)
QBLOCK = 32    # columns per activation block (one activation scale)


@dataclass(frozen=True)
class QuantStrips:
    """One layer's weight in the GEMM's layout; ``n`` its output rows."""
    strips: torch.Tensor   # int8 [S, K / 4, 16, 4] | uint8 [S, K / 8, 16, 4]
    scales: torch.Tensor   # float32 [S, G, 16]
    aux: torch.Tensor      # int8: int32 [S, K / 32, 16] (128 * block sums of q) | int4: float32 [S, G, 16] zeros
    n: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.strips, self.scales, self.aux))


def strips_supported(in_features: int, group_size: int) -> bool:
    """The GEMM takes widths of whole activation blocks and groups of whole blocks."""
    return in_features % QBLOCK == 0 and group_size % QBLOCK == 0


def _pad_rows(t: torch.Tensor) -> torch.Tensor:  # [n, ...] -> [S * 16, ...], zero rows appended
    extra = -t.shape[0] % STRIP
    return t if extra == 0 else torch.cat([t, t.new_zeros((extra, *t.shape[1:]))])


def _per_strip(t: torch.Tensor) -> torch.Tensor:  # [n, G] -> [S, G, 16]
    t = _pad_rows(t)
    return t.view(-1, STRIP, t.shape[1]).permute(0, 2, 1).contiguous()


def strips_int8(q: torch.Tensor, scale: torch.Tensor) -> QuantStrips:  # q [n, K] int8, scale [n, G]
    n, k = q.shape
    p = _pad_rows(q)
    strips = p.view(-1, STRIP, k // 4, 4).permute(0, 2, 1, 3).contiguous()
    wsum = p.view(p.shape[0], k // QBLOCK, QBLOCK).to(torch.int32).sum(dim=2) * 128   # [S * 16, K / 32]
    return QuantStrips(strips, _per_strip(scale.float()), _per_strip(wsum).to(torch.int32), n)


def strips_int4(packed: torch.Tensor, scale: torch.Tensor, zeros: torch.Tensor | None = None) -> QuantStrips:
    """``packed`` [n, K / 2] (quant_pack's int4 packing), ``scale`` / ``zeros`` [n, G] (zeros None: 8)."""
    nib = _pad_rows(unpack_int4(packed))                                   # [S * 16, K] in [0, 15]
    rows, k = nib.shape
    v = nib.view(rows // STRIP, STRIP, k // 8, 2, 4)
    strips = (v[:, :, :, 0] | (v[:, :, :, 1] << 4)).permute(0, 2, 1, 3).contiguous()
    z = torch.full_like(scale, 8.0) if zeros is None else zeros
    return QuantStrips(strips, _per_strip(scale.float()), _per_strip(z.float()), packed.shape[0])


def quantize_blocks_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (xq [T, K] int8 values as float64, sx [T, K / 32] float32): per block sx = max |x| * (1 / 127),
    xq = x * (127 / max |x|) rounded to nearest even (the kernel's float32 steps)."""
    t, k = x.shape
    b = x.float().view(t, k // QBLOCK, QBLOCK)
    amax = b.abs().amax(dim=2)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    xq = torch.round(b * inv[:, :, None]).view(t, k)
    return xq.double(), amax * torch.tensor(1.0 / 127.0, dtype=torch.float32)


def quant_gemm_reference(xq: torch.Tensor, sx: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                         zeros: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The GEMM's maths in float64: xq [T, K], sx [T, K / 32], w [n, K] integer weights (int8 q or int4 n), scale and
    zeros [n, G] -> y [T, n] = sum_b scale[g(b)] sx[b] (dot_b - zero[g(b)] * sum_b xq) (+ bias)."""
    t, k = xq.shape
    n, groups = scale.shape
    nb = k // QBLOCK
    dots = torch.einsum("tbc,nbc->tnb", xq.double().view(t, nb, QBLOCK), w.double().view(n, nb, QBLOCK))
    xsum = xq.double().view(t, nb, QBLOCK).sum(dim=2)                       # [T, nb]
    g = torch.arange(nb) * groups // nb                                    # block -> group
    sw, z = scale.double()[:, g], zeros.double()[:, g]                     # [n, nb]
    y = ((dots - z[None] * xsum[:, None]) * sw[None] * sx.double()[:, None]).sum(dim=2)
    return y if bias is None else y + bias.double()
