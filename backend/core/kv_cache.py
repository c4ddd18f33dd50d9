"""The paged KV cache: per-layer K and V tensors of fixed-size blocks.

Block ids are the ones the block manager hands out; slot ``block * block_size + offset``
addresses one token. All layers live in one allocation ``[2, num_layers, num_blocks, ...]``
so that copy-on-write copies a block in every layer with one indexing op.

A quantized cache (``kv_cache_dtype`` int8 / fp8, ``backend/core/kv_quant.py``) stores 8-bit values
and a second allocation of fp16 scales ``[2, num_layers, num_blocks, block_size, num_kv_heads]``,
one per token and head; block copies move both, and the byte budget counts both.
"""
from __future__ import annotations

from typing import Sequence

import torch

from backend.core.kv_quant import (
    SCALE_DTYPE,
    KVFormat,
    as_bytes,
    bytes_per_kv_element_row,
    check_kv_format_device,
    kv_format,
)


def kv_bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                       dtype: torch.dtype, kv_cache_dtype: str = "auto") -> int:
    """Bytes one block takes across all layers, K and V together, scales included."""
    fmt = kv_format(kv_cache_dtype, dtype)
    return 2 * num_layers * block_size * num_kv_heads * bytes_per_kv_element_row(fmt, head_dim)


def num_blocks_for_budget(budget_bytes: int, num_layers: int, block_size: int, num_kv_heads: int,
                          head_dim: int, dtype: torch.dtype, kv_cache_dtype: str = "auto") -> int:
    """How many whole blocks fit in ``budget_bytes``; raises ``ValueError`` if not even one."""
    per_block = kv_bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype, kv_cache_dtype)
    n = int(budget_bytes) // per_block
    if n < 1:
        raise ValueError(f"KV budget of {budget_bytes} bytes holds no block ({per_block} bytes per block)")
    return n


class KVCache:
    """``k[layer]`` and ``v[layer]``, each ``[num_blocks, block_size, num_kv_heads, head_dim]`` in
    ``format.storage``; when quantized, ``k_scale[layer]`` and ``v_scale[layer]``, each
    ``[num_blocks, block_size, num_kv_heads]`` fp16 (else None). ``dtype`` is the compute dtype
    attention returns.

    Zero-initialised, so unwritten slots hold finite values: a masked-out key then
    contributes exactly nothing (a NaN there would poison ``0 * v``).
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 kv_cache_dtype: str = "auto"):
        if min(num_layers, num_blocks, block_size, num_kv_heads, head_dim) < 1:
            raise ValueError("KVCache dimensions must all be positive")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.format: KVFormat = kv_format(kv_cache_dtype, dtype)
        check_kv_format_device(self.format, device)
        # [2, num_layers, num_blocks, block_size, num_kv_heads, head_dim]
        self.data = torch.zeros(2, num_layers, num_blocks, block_size, num_kv_heads, head_dim,
                                dtype=self.format.storage, device=device)
        self.k = list(self.data[0].unbind(0))  # num_layers x [num_blocks, block_size, num_kv_heads, head_dim]
        self.v = list(self.data[1].unbind(0))
        # [2, num_layers, num_blocks, block_size, num_kv_heads] fp16, or None when not quantized
        self.scales: torch.Tensor | None = None
        self.k_scale: list[torch.Tensor | None] = [None] * num_layers
        self.v_scale: list[torch.Tensor | None] = [None] * num_layers
        if self.format.quantized:
            self.scales = torch.ones(2, num_layers, num_blocks, block_size, num_kv_heads, dtype=SCALE_DTYPE,
                                     device=device)
            self.k_scale = list(self.scales[0].unbind(0))
            self.v_scale = list(self.scales[1].unbind(0))

    @classmethod
    def from_budget(cls, budget_bytes: int, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                    kv_cache_dtype: str = "auto") -> "KVCache":
        n = num_blocks_for_budget(budget_bytes, num_layers, block_size, num_kv_heads, head_dim, dtype, kv_cache_dtype)
        return cls(num_layers, n, block_size, num_kv_heads, head_dim, dtype, device, kv_cache_dtype)

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def nbytes(self) -> int:
        scales = 0 if self.scales is None else self.scales.numel() * self.scales.element_size()
        return self.data.numel() * self.data.element_size() + scales

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy-on-write: block ``src`` → block ``dst`` in every layer, for every ``(src, dst)``.

        Sources are read before any destination is written, so a destination may also be
        another pair's source.
        """
        if not pairs:
            return
        idx = torch.tensor(pairs, dtype=torch.int64, device=self.data.device)  # [num_pairs, 2]
        src, dst = idx[:, 0], idx[:, 1]
        if int(idx.min()) < 0 or int(idx.max()) >= self.num_blocks:
            raise IndexError(f"copy_blocks: block id out of range [0, {self.num_blocks})")
        data = as_bytes(self.data)   # float8 has no index kernels everywhere: copy its bytes
        data.index_copy_(2, dst, data.index_select(2, src))
        if self.scales is not None:
            self.scales.index_copy_(2, dst, self.scales.index_select(2, src))
