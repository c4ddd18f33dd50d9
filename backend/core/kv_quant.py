"""The KV cache's storage formats (``kv_cache_dtype``) and their quantization maths.

``auto`` stores K/V in the model's compute dtype. ``int8`` and ``fp8`` (float8 e4m3) store one
8-bit value per element plus one fp16 scale per (token, KV head): ``x ~= q * scale``, with
``scale = max(|x|) / qmax`` over that token's ``head_dim`` values.

Why per token and head: a token's K/V are written once, by the slot-write path, and never change,
so its scale is known at write time and no block is ever re-quantized (a per-block scale would
have to grow as later tokens arrive and rewrite the block's earlier values); copy-on-write, rollback
and preemption then need nothing more than moving the scales with their slots. Per token it is also
the finest scale that stays cheap: at ``head_dim`` 32 the fp16 scale adds 2 bytes to 32 (int8: 3.76x
the tokens of fp32 in the same bytes, against 3.2x with an fp32 scale; at ``head_dim`` 128, 3.94x).

The rounding is ``floor(x / scale + 0.5)`` (not torch's half-to-even) so the Triton write kernel and
this reference produce the same codes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

KV_CACHE_DTYPES = ("auto", "int8", "fp8")
SCALE_DTYPE = torch.float16
MIN_SCALE = 2.0 ** -14        # fp16's smallest normal: an all-zero head never divides by zero
INT8_MAX = 127.0
FP8_MAX = 448.0               # largest finite float8 e4m3fn


@dataclass(frozen=True)
class KVFormat:
    """How one K or V element is stored: ``storage`` elements, and a ``SCALE_DTYPE`` scale per (token, head)
    when ``quantized``."""

    name: str                  # auto | int8 | fp8
    storage: torch.dtype       # element type of the cache tensors
    qmax: float = 0.0          # largest |q| of a quantized format (0: not quantized)

    @property
    def quantized(self) -> bool:
        return self.qmax > 0

    @property
    def label(self) -> str:
        """What the load line, metrics and logs call it (``auto`` resolved to the dtype it stores)."""
        return self.name if self.quantized else str(self.storage).replace("torch.", "")


def kv_format(kv_cache_dtype: str, compute_dtype: torch.dtype) -> KVFormat:
    """The storage format ``kv_cache_dtype`` names; ``ValueError`` naming the parameter if unknown."""
    if kv_cache_dtype == "auto":
        return KVFormat("auto", compute_dtype)
    if kv_cache_dtype == "int8":
        return KVFormat("int8", torch.int8, INT8_MAX)
    if kv_cache_dtype == "fp8":
        return KVFormat("fp8", torch.float8_e4m3fn, FP8_MAX)
    raise ValueError(f"kv_cache_dtype: expected one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")


def check_kv_format_device(fmt: KVFormat, device: torch.device | str) -> None:
    """fp8 KV is refused off CUDA: the CPU converts float8 in software, ~16x slower to read back than int8."""
    if fmt.name == "fp8" and torch.device(device).type != "cuda":
        raise ValueError("kv_cache_dtype: fp8 needs a CUDA device (the CPU converts float8 in software: reading "
                         "it back is ~16x slower than int8 there); use kv_cache_dtype int8 on the CPU")


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """float8 tensors as uint8 (same bytes) for indexing copies, which torch does not implement for float8 on
    every device; other tensors unchanged."""
    return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else t


def bytes_per_kv_element_row(fmt: KVFormat, head_dim: int) -> int:
    """Bytes one token's K (or V) takes in one KV head: its values plus, if quantized, its scale."""
    item = torch.empty((), dtype=fmt.storage).element_size()
    scale = torch.empty((), dtype=SCALE_DTYPE).element_size() if fmt.quantized else 0
    return head_dim * item + scale


def quantize_per_token_head(
    x: torch.Tensor,   # [num_tokens, num_kv_heads, head_dim] any float dtype
    fmt: KVFormat,
) -> tuple[torch.Tensor, torch.Tensor]:  # q [num_tokens, num_kv_heads, head_dim] fmt.storage, scale [.., kv_heads]
    """Symmetric quantization with one fp16 scale per (token, head)."""
    xf = x.float()
    scale = (xf.abs().amax(-1) / fmt.qmax).clamp_min(MIN_SCALE).to(SCALE_DTYPE)   # [T, H]
    y = xf / scale.float().unsqueeze(-1)
    if fmt.storage == torch.int8:
        q = torch.floor(y + 0.5).clamp_(-fmt.qmax, fmt.qmax).to(torch.int8)
    else:
        q = y.clamp_(-fmt.qmax, fmt.qmax).to(fmt.storage)
    return q, scale


def dequantize_into(
    out: torch.Tensor,    # [..., head_dim] compute dtype
    q: torch.Tensor,      # [..., head_dim] int8 / float8
    scale: torch.Tensor,  # [...] SCALE_DTYPE
) -> torch.Tensor:        # out, holding q * scale
    out.copy_(q)
    return out.mul_(scale.unsqueeze(-1))
