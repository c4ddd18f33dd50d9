"""The paged KV cache: per-layer K and V tensors of fixed-size blocks.

Block ids are the ones the block manager hands out; slot ``block * block_size + offset``
addresses one token. All layers live in one allocation ``[2, num_layers, num_blocks, ...]``
so that copy-on-write copies a block in every layer with one indexing op.
"""
from __future__ import annotations

from typing import Sequence

import torch


def kv_bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                       dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers, K and V together."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize


def num_blocks_for_budget(budget_bytes: int, num_layers: int, block_size: int, num_kv_heads: int,
                          head_dim: int, dtype: torch.dtype) -> int:
    """How many whole blocks fit in ``budget_bytes``; raises ``ValueError`` if not even one."""
    per_block = kv_bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype)
    n = int(budget_bytes) // per_block
    if n < 1:
        raise ValueError(f"KV budget of {budget_bytes} bytes holds no block ({per_block} bytes per block)")
    return n


class KVCache:
    """``k[layer]`` and ``v[layer]``, each ``[num_blocks, block_size, num_kv_heads, head_dim]``.

    Zero-initialised, so unwritten slots hold finite values: a masked-out key then
    contributes exactly nothing (a NaN there would poison ``0 * v``).
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        if min(num_layers, num_blocks, block_size, num_kv_heads, head_dim) < 1:
            raise ValueError("KVCache dimensions must all be positive")
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        # [2, num_layers, num_blocks, block_size, num_kv_heads, head_dim]
        self.data = torch.zeros(2, num_layers, num_blocks, block_size, num_kv_heads, head_dim,
                                dtype=dtype, device=device)
        self.k = list(self.data[0].unbind(0))  # num_layers x [num_blocks, block_size, num_kv_heads, head_dim]
        self.v = list(self.data[1].unbind(0))

    @classmethod
    def from_budget(cls, budget_bytes: int, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> "KVCache":
        n = num_blocks_for_budget(budget_bytes, num_layers, block_size, num_kv_heads, head_dim, dtype)
        return cls(num_layers, n, block_size, num_kv_heads, head_dim, dtype, device)

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

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
        self.data.index_copy_(2, dst, self.data.index_select(2, src))
