"""Weight-only quantization of the decoder's linear layers, applied at load or read from a checkpoint.

Modes (``EngineConfig.model.quantization``; the formats: ``backend/model/quant_pack.py``):
- ``int8``: symmetric per output channel (or per group, from a GPTQ checkpoint), ``q`` in [-127, 127];
- ``int4``: per group of ``group_size`` input columns, two per byte, symmetric (or with zero points, GPTQ);
- ``fp8``: float8 e4m3 per output channel, CUDA only.

Decode at batch 1 reads every weight once per token, so narrower weights mean fewer bytes from memory.
On the CPU (fp32 compute, the native kernels built), a layer whose width is whole blocks of 32 columns (and int4
groups whole blocks) runs every step through the quantized GEMM (``backend/native/csrc/quant_gemm.h``, the weight in
its strips, ``quant_strips.py``): the activations quantized to int8 per token and block of 32 columns, integer dot
products (VNNI, else AVX2), any token count, each weight byte read once a step, and each token's output independent of the
other tokens of the step (batch-invariant). Other layers take the older few-token kernels (``quant_gemv.cpp``, up to
``FEW_TOKENS``, ``native_kernel``) or convert the layer's integers into a reused full-precision buffer shared by all
layers of the same shape, then one matmul. fp8 needs CUDA (the CPU converts float8 in software, 40x slower than
int8). On CUDA, int8/int4 inputs of up to ``FEW_TOKENS`` tokens go to the Triton GEMV
(``backend/model/quant_triton.py``), larger ones and fp8 are dequantized to the compute dtype. The embedding stays in
full precision; in the int8 and int4 modes the LM head is quantized to int8 per output channel (at batch 1 it is
read once a token like any projection); a tied head keeps the embedding's tensor and adds its int8 copy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from backend.config import QUANTIZATION_MODES as MODES
from backend.model.quant_pack import (  # noqa: F401  (re-exported: the formats' maths)
    FP8_MAX,
    dequantize_int4,
    dequantize_int8,
    int4_block,
    pack_int4,
    quantize_fp8,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)
from backend.model.quant_strips import QuantStrips, strips_int4, strips_int8, strips_supported

CHUNK_BYTES = 512 * 1024     # per-channel int8 without the native kernel: dequantize this much at a time
FEW_TOKENS = 8               # inputs up to this many tokens take the native kernel (memory-bound GEMV)
HEAD_INT8_MODES = ("int8", "int4")   # modes whose LM head is quantized too, to int8 per output channel


@dataclass(frozen=True)
class QuantizedWeight:
    """One layer's quantized weight; ``scale`` (and ``zeros``) are [out_features, in_features / group_size]."""
    mode: str                          # int8 | int4 | fp8
    qweight: torch.Tensor              # int8 [out, in] | uint8 [out, in / 2] (quant_pack's int4 packing) | fp8 [out, in]
    scale: torch.Tensor                # [out, groups] float
    group_size: int                    # input columns per scale (in_features: per output channel)
    zeros: torch.Tensor | None = None  # int4 only, [out, groups] float: the nibble that means 0 (None: 8)
    origin: str = "quantized at load"  # or the checkpoint it was read from

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1] * (2 if self.mode == "int4" else 1)


def quantize_weight(w: torch.Tensor, mode: str, group_size: int) -> QuantizedWeight:  # w [out, in]
    w = w.detach().float()
    if mode == "int8":
        q, scale = quantize_int8(w)
        return QuantizedWeight(mode, q, scale[:, None], w.shape[1])
    if mode == "int4":
        q, scale = quantize_int4(w, group_size)
        return QuantizedWeight(mode, q, scale, group_size)
    q, scale = quantize_fp8(w)
    return QuantizedWeight(mode, q, scale[:, None], w.shape[1])


def gemm_strips(weight: QuantizedWeight, compute_dtype: torch.dtype, native: Any | None) -> QuantStrips | None:
    """The weight in the quantized GEMM's strips when the native GEMM serves this layer (fp32 on the CPU, whole
    32-column blocks and groups), else None."""
    if native is None or not hasattr(native, "quant_gemm") or compute_dtype != torch.float32 \
            or weight.qweight.device.type != "cpu" or weight.mode not in ("int8", "int4") \
            or not strips_supported(weight.in_features, weight.group_size):
        return None
    if weight.mode == "int8":
        return strips_int8(weight.qweight, weight.scale)
    return strips_int4(weight.qweight, weight.scale, weight.zeros)


def native_kernel(weight: QuantizedWeight, compute_dtype: torch.dtype, device: torch.device) -> str | None:
    """The quant_gemv.cpp op that serves this layer for few tokens, or None (fp32 on the CPU only).

    int4 groups of 64k columns: ``quant_gemv_int4_q8`` (the activations quantized to int8 per group, VNNI
    dot products: less CPU time than dequantizing, see docs/quantization.md); groups of 32:
    ``quant_gemv_int4`` (exact dequantize-and-FMA); int8 per channel or in groups of 16k: ``quant_gemv_int8``."""
    if device.type != "cpu" or compute_dtype != torch.float32:
        return None
    if weight.mode == "int4":
        if weight.group_size % 64 == 0:
            return "quant_gemv_int4_q8"
        return "quant_gemv_int4" if weight.group_size % 32 == 0 else None
    if weight.mode == "int8" and (weight.scale.shape[1] == 1 or weight.group_size % 16 == 0):
        return "quant_gemv_int8"
    return None


class QuantLinear(nn.Module):
    """A quantized ``nn.Linear``: the native GEMM (any token count), the older native kernels (few tokens), or
    dequantize into a shared buffer + matmul."""

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None, compute_dtype: torch.dtype,
                 workspace: dict, native: Any | None = None):
        super().__init__()
        self.mode, self.group_size, self.origin = weight.mode, weight.group_size, weight.origin
        self.out_features, self.in_features = weight.qweight.shape[0], weight.in_features
        self.compute_dtype = compute_dtype
        self.register_buffer("qweight", weight.qweight.contiguous())
        self.register_buffer("scale", weight.scale.to(compute_dtype).contiguous())
        self.register_buffer("zeros", None if weight.zeros is None else weight.zeros.to(compute_dtype).contiguous())
        self.bias = bias
        self._workspace = workspace        # (shape, dtype, device) -> buffer, shared with the model's other layers
        self.strips = gemm_strips(weight, compute_dtype, native)   # the GEMM's layout (a copy), or None
        self._gemm = native.quant_gemm if self.strips is not None else None
        op = native_kernel(weight, compute_dtype, weight.qweight.device) \
            if native is not None and self.strips is None else None
        self.native_op = "quant_gemm" if self.strips is not None else op  # the native op that serves it, or None
        self._native = getattr(native, op) if op else None
        # the buffer path's int4 dequantization (prefill, batches past FEW_TOKENS) in one native pass
        self._native_dequant = native.quant_dequant_int4 if op and weight.mode == "int4" else None
        self._triton_gemv = None
        if weight.qweight.device.type == "cuda" and weight.mode in ("int8", "int4"):
            from backend.model.quant_triton import triton_quant_gemv
            self._triton_gemv = triton_quant_gemv
        itemsize = torch.empty((), dtype=compute_dtype).element_size()
        self.chunk_rows = max(16, CHUNK_BYTES // (self.in_features * itemsize))

    @classmethod
    def from_linear(cls, layer: nn.Linear, mode: str, group_size: int, workspace: dict,
                    native: Any | None = None) -> QuantLinear:
        weight = quantize_weight(layer.weight, mode, group_size)
        dev = layer.weight.device
        weight = QuantizedWeight(mode, weight.qweight.to(dev), weight.scale.to(dev), weight.group_size)
        return cls(weight, layer.bias, layer.weight.dtype, workspace, native)

    def _buffer(self, rows: int | None = None) -> torch.Tensor:  # [rows or out_features, in_features], shared by shape
        rows = rows or self.out_features
        key = (rows, self.in_features, self.compute_dtype, self.qweight.device)
        buf = self._workspace.get(key)
        if buf is None:
            buf = self._workspace[key] = torch.empty(rows, self.in_features, dtype=self.compute_dtype,
                                                     device=self.qweight.device)
        return buf

    def dequantized(self) -> torch.Tensor:  # [out_features, in_features]: the weight this layer stands for
        if self._native_dequant is not None:
            return self._native_dequant(self.qweight, self.scale, self.zeros, self._buffer())
        if self.mode == "int4":
            return dequantize_int4(self.qweight, self.scale, self._buffer(), self.zeros)
        return dequantize_int8(self.qweight, self.scale, self._buffer())  # (fp8 converts the same way)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # x [num_tokens, in] -> [num_tokens, out]
        if self._gemm is not None:
            s = self.strips
            y = self._gemm(x.reshape(-1, x.shape[-1]).contiguous(), s.strips, s.scales, s.aux, s.n, self.bias)
            return y.view(*x.shape[:-1], s.n)
        if self._native is not None and x.shape[0] <= FEW_TOKENS:
            return self._native_forward(x.contiguous())
        if self._triton_gemv is not None and x.shape[0] <= FEW_TOKENS:
            return self._triton_gemv(x, self.qweight, self.scale, self.zeros, self.bias, self.mode)
        if self.mode == "int4" or self.scale.shape[1] > 1:
            return F.linear(x, self.dequantized(), self.bias)
        if x.shape[0] <= FEW_TOKENS and self.chunk_rows < self.out_features and x.device.type == "cpu":
            y = self._chunked(x)
        else:
            y = F.linear(x, self._buffer().copy_(self.qweight))
        y = y * self.scale[:, 0]                                             # per-channel scale on the output
        return y if self.bias is None else y + self.bias

    def _native_forward(self, x: torch.Tensor) -> torch.Tensor:  # x [n <= FEW_TOKENS, in] -> [n, out]
        if self.mode == "int4":
            return self._native(x, self.qweight, self.scale, self.zeros, self.bias)
        return self._native(x, self.qweight, self.scale, self.bias)

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
    def nbytes(self) -> int:  # the quantized weight (the GEMM's strips are a second copy, not counted)
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scale, self.zeros) if t is not None)


def native_ops_for(device: torch.device) -> Any | None:
    """``torch.ops.triton_llm`` when the native kernels are built (CPU only), else None (the torch path)."""
    if device.type != "cpu":
        return None
    from backend.native import native_ops
    return native_ops().ops


def linear_targets(model: nn.Module) -> dict[str, tuple[nn.Module, str]]:
    """The quantized projections: ``layers.{i}.{part}.{name}`` -> (parent module, attribute name)."""
    return {f"layers.{i}.{part}.{name}": (getattr(layer, part), name)
            for i, layer in enumerate(model.layers)
            for part, names in (("self_attn", ("qkv_proj", "o_proj")), ("mlp", ("gate_up_proj", "down_proj")))
            for name in names}


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


def check_prequantized(mode: str, layers: dict[str, QuantLinear]) -> None:
    """A checkpoint that arrived quantized is served as it is: ``none`` or its own mode, nothing else."""
    if mode not in MODES:
        raise ValueError(f"quantization: expected one of {MODES}, got {mode!r}")
    first = next(iter(layers.values()))
    if mode not in ("none", first.mode):
        raise ValueError(f"quantization: {mode!r} conflicts with the pre-quantized checkpoint ({first.origin}: "
                         f"{first.mode}); use 'none' or {first.mode!r}, or a full-precision checkpoint")


def quantize_model(model: nn.Module, mode: str, group_size: int = 128) -> int:
    """Replace the decoder layers' linear projections by ``QuantLinear``; returns the weight bytes saved.

    A model whose projections were loaded quantized (``loader.load_model`` of a GPTQ checkpoint) is left as
    it is when ``mode`` is ``none`` or its own mode, and refused otherwise."""
    targets = linear_targets(model)
    layers = {k: getattr(m, n) for k, (m, n) in targets.items()}
    if any(isinstance(layer, QuantLinear) for layer in layers.values()):
        check_prequantized(mode, layers)
        return 0
    if mode == "none":
        return 0
    device = model.embed_tokens.weight.device
    check_quantizable(mode, group_size, layers, device)
    workspace: dict = {}
    native = native_ops_for(device) if mode in ("int8", "int4") else None
    saved = 0
    for module, name in targets.values():
        old = getattr(module, name)
        new = QuantLinear.from_linear(old, mode, group_size, workspace, native)
        saved += old.weight.numel() * old.weight.element_size() - new.nbytes
        setattr(module, name, new)
    if mode in HEAD_INT8_MODES:
        head = model.lm_head
        model.lm_head = QuantLinear.from_linear(head, "int8", 0, workspace, native)
        if not model.config.tie_word_embeddings:      # a tied head's tensor stays: it is the embedding
            saved += head.weight.numel() * head.weight.element_size() - model.lm_head.nbytes
    return saved
