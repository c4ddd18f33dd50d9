"""Weight-only quantization of the decoder's linear layers, applied at load.

Modes (``EngineConfig.quantization``):
- ``int8``: symmetric per output channel, ``w ~= q * scale[out]`` with ``q`` in [-127, 127];
- ``int4``: symmetric per group of ``group_size`` input columns, ``q`` in [-8, 7], two per byte;
- ``fp8``: float8 e4m3 per output channel (``w ~= q * scale[out]``, ``|q| <= 448``).

Decode at batch 1 reads every weight once per token, so narrower weights mean fewer bytes from
memory. On the CPU the fastest path measured here is to convert a layer's integers into a reused
full-precision buffer, call a plain matmul, and apply the per-channel scale to the (small) output:
on a 2048 x 768 layer whose weights are not in cache, 219 us against 604 us for fp32 (torch's packed
int8/int4 CPU kernels were 2.6x and 5.4x slower than fp32; multiplying the scale into the buffer,
449 us). With the weights in cache (small models) the conversion costs more than it saves: the
numbers in docs/quantization.md say when to use which. One buffer per weight shape is shared by
all layers (they run one after another). int4 scales vary along the input, so they are applied to
the buffer. fp8 needs CUDA (the CPU converts float8 in software, 40x slower than int8); on CUDA
every mode is weight-only, dequantized to the compute dtype (a fused kernel is future work).
The embedding and the LM head stay in full precision (with a tied head they share one tensor).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from backend.config import QUANTIZATION_MODES as MODES

FP8_MAX = 448.0
CHUNK_BYTES = 512 * 1024     # int8 at few tokens: dequantize this much of a layer at a time, so it stays in cache
FEW_TOKENS = 8


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # w [out, in] -> (q int8, scale [out])
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    return torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale


def quantize_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (packed uint8 [out, in / 2]: even column in the low nibble, scale [out, in / group])."""
    out_f, in_f = w.shape
    g = w.reshape(out_f, in_f // group, group)
    scale = g.abs().amax(dim=2).clamp(min=1e-12) / 7.0
    q = torch.round(g / scale[:, :, None]).clamp_(-8, 7).to(torch.int16).reshape(out_f, in_f) + 8
    return (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8), scale


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX
    return (w / scale[:, None]).to(torch.float8_e4m3fn), scale


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Unpack into ``out`` [out_features, in_features] (the compute dtype)."""
    o, half = packed.shape
    q = out.view(o, half, 2)
    q[:, :, 0].copy_(packed & 0xF)
    q[:, :, 1].copy_(packed >> 4)
    out.sub_(8.0)
    g = scale.shape[1]
    out.view(o, g, -1).mul_(scale[:, :, None])
    return out


class QuantLinear(nn.Module):
    """A quantized ``nn.Linear``: ``forward(x)`` dequantizes into the shared buffer, then one matmul."""

    def __init__(self, layer: nn.Linear, mode: str, group_size: int, workspace: dict):
        super().__init__()
        w = layer.weight.detach().float()
        self.mode = mode
        self.out_features, self.in_features = w.shape
        self.compute_dtype = layer.weight.dtype
        if mode == "int8":
            q, scale = quantize_int8(w)
        elif mode == "int4":
            q, scale = quantize_int4(w, group_size)
        else:
            q, scale = quantize_fp8(w)
        self.register_buffer("qweight", q.to(layer.weight.device))
        self.register_buffer("scale", scale.to(layer.weight.device, self.compute_dtype))
        self.bias = layer.bias
        self._workspace = workspace        # (shape, dtype, device) -> buffer, shared with the model's other layers
        itemsize = torch.empty((), dtype=self.compute_dtype).element_size()
        self.chunk_rows = max(16, CHUNK_BYTES // (self.in_features * itemsize))

    def _buffer(self, rows: int | None = None) -> torch.Tensor:  # [rows or out_features, in_features], shared by shape
        rows = rows or self.out_features
        key = (rows, self.in_features, self.compute_dtype, self.qweight.device)
        buf = self._workspace.get(key)
        if buf is None:
            buf = self._workspace[key] = torch.empty(rows, self.in_features, dtype=self.compute_dtype,
                                                     device=self.qweight.device)
        return buf

    def dequantized(self) -> torch.Tensor:  # [out_features, in_features]: the weight this layer stands for
        buf = self._buffer()
        if self.mode == "int4":
            return dequantize_int4(self.qweight, self.scale, buf)
        return buf.copy_(self.qweight).mul_(self.scale[:, None])

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # x [num_tokens, in] -> [num_tokens, out]
        if self.mode == "int4":
            return F.linear(x, dequantize_int4(self.qweight, self.scale, self._buffer()), self.bias)
        if x.shape[0] <= FEW_TOKENS and self.chunk_rows < self.out_features and x.device.type == "cpu":
            y = self._chunked(x)
        else:
            y = F.linear(x, self._buffer().copy_(self.qweight))
        y = y * self.scale                                                   # per-channel scale on the output
        return y if self.bias is None else y + self.bias

    def _chunked(self, x: torch.Tensor) -> torch.Tensor:  # x [n, in] -> [n, out] without the scale
        """Decode-sized inputs of a layer larger than the cache: convert and multiply a block of rows at a
        time, so each block is read once from memory (as int8) and then only from cache."""
        rows = self.chunk_rows
        buf = self._buffer(rows)
        y_t = torch.empty(self.out_features, x.shape[0], dtype=x.dtype, device=x.device)  # [out, n]
        x_t = x.t()
        for r in range(0, self.out_features, rows):
            n = min(rows, self.out_features - r)
            b = buf[:n].copy_(self.qweight[r:r + n])
            torch.mm(b, x_t, out=y_t[r:r + n])
        return y_t.t()

    __call__ = forward

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() * self.qweight.element_size() + self.scale.numel() * self.scale.element_size()


def check_quantizable(mode: str, group_size: int, layers: dict[str, nn.Linear], device: torch.device) -> None:
    """Raise ``ValueError`` naming the parameter when the mode cannot quantize these layers on this device."""
    if mode not in MODES:
        raise ValueError(f"quantization: expected one of {MODES}, got {mode!r}")
    if mode == "fp8" and device.type != "cuda":
        raise ValueError("quantization: fp8 needs a CUDA device (the CPU converts float8 in software, far slower "
                         "than full precision); use int8 on the CPU")
    if mode == "int4":
        for name, layer in layers.items():
            if layer.in_features % group_size or group_size % 2:
                raise ValueError(f"quantization_group_size: {group_size} does not divide {name}'s "
                                 f"{layer.in_features} input features (int4 groups must, and be even)")


def quantize_model(model: nn.Module, mode: str, group_size: int = 128) -> int:
    """Replace the decoder layers' linear projections by ``QuantLinear``; returns the weight bytes saved."""
    if mode == "none":
        return 0
    targets = {f"layers.{i}.{part}.{name}": (getattr(layer, part), name)
               for i, layer in enumerate(model.layers)
               for part, names in (("self_attn", ("qkv_proj", "o_proj")), ("mlp", ("gate_up_proj", "down_proj")))
               for name in names}
    check_quantizable(mode, group_size, {k: getattr(m, n) for k, (m, n) in targets.items()},
                      model.embed_tokens.weight.device)
    workspace: dict = {}
    saved = 0
    for module, name in targets.values():
        old = getattr(module, name)
        new = QuantLinear(old, mode, group_size, workspace)
        saved += old.weight.numel() * old.weight.element_size() - new.nbytes
        setattr(module, name, new)
    return saved
