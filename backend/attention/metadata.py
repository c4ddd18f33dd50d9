"""Per-step attention metadata: where each new token's K/V goes and what each query may see.

The runner builds one ``AttentionMetadata`` per step (``build_attention_metadata``) and hands
it to ``AttentionBackend.prepare``; every layer then reuses it. Tokens are flat: the new
tokens of sequence 0, then of sequence 1, and so on (``query_start_loc`` delimits them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor     # [num_tokens] int64  block_id * block_size + offset of each new token's K/V
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32  cumulative query lengths (new tokens per sequence)
    seq_lens: torch.Tensor         # [num_seqs] int32  context length after this step (computed + new)
    block_tables: torch.Tensor     # [num_seqs, max_blocks_per_seq] int32 (padded with 0)
    max_query_len: int
    max_seq_len: int
    positions: torch.Tensor | None = None  # [num_tokens] int64  position of each new token
    block_size: int = 0                    # tokens per KV block (0: unknown; backends take it from the cache)

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.shape[0]

    @property
    def is_pure_decode(self) -> bool:
        """Every sequence has exactly one new token (so ``num_tokens == num_seqs``)."""
        return self.max_query_len == 1

    def to(self, device: torch.device | str) -> "AttentionMetadata":
        mv = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return AttentionMetadata(mv(self.slot_mapping), mv(self.query_start_loc), mv(self.seq_lens),
                                 mv(self.block_tables), self.max_query_len, self.max_seq_len,
                                 mv(self.positions), self.block_size)


def token_positions(num_computed_tokens: np.ndarray,  # [num_seqs]
                    query_lens: np.ndarray,           # [num_seqs]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``(seq_index, position)`` of every new token, each ``[num_tokens]`` int64.

    Token ``i`` of sequence ``s`` sits at position ``num_computed_tokens[s] + i``.
    """
    seq_index = np.repeat(np.arange(len(query_lens), dtype=np.int64), query_lens)
    starts = np.cumsum(query_lens) - query_lens                       # [num_seqs] first flat token
    offset_in_seq = np.arange(seq_index.shape[0], dtype=np.int64) - starts[seq_index]
    return seq_index, num_computed_tokens[seq_index] + offset_in_seq


def slots_for_positions(block_tables: np.ndarray,  # [num_seqs, max_blocks] int
                        seq_index: np.ndarray,     # [num_tokens]
                        positions: np.ndarray,     # [num_tokens]
                        block_size: int) -> np.ndarray:  # [num_tokens] int64
    """Cache slot ``block_table[pos // block_size] * block_size + pos % block_size`` per token."""
    blocks = block_tables[seq_index, positions // block_size].astype(np.int64)
    return blocks * block_size + positions % block_size


def build_attention_metadata(
    num_computed_tokens: Sequence[int],   # per sequence: tokens whose K/V are already cached
    num_new_tokens: Sequence[int],        # per sequence: tokens computed in this step (>= 1)
    block_tables: Sequence[Sequence[int]],  # per sequence: physical block ids, in order
    block_size: int,
    device: torch.device | str = "cpu",
    pad_blocks_to: int | None = None,     # fixed block-table width (e.g. for graph capture)
) -> AttentionMetadata:
    """Flat per-step tensors from per-sequence lists; pure (no state, no cache access).

    Raises ``ValueError`` when a block table does not cover its sequence's new positions.
    """
    n = len(num_new_tokens)
    if not (len(num_computed_tokens) == n == len(block_tables)):
        raise ValueError("num_computed_tokens, num_new_tokens and block_tables differ in length")
    if n == 0:
        raise ValueError("no sequences scheduled")
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    computed = np.asarray(num_computed_tokens, dtype=np.int64)
    qlens = np.asarray(num_new_tokens, dtype=np.int64)
    if (qlens < 1).any() or (computed < 0).any():
        raise ValueError("each sequence needs >= 1 new token and >= 0 computed tokens")
    seq_lens = computed + qlens
    nblocks = np.fromiter((len(b) for b in block_tables), dtype=np.int64, count=n)
    short = np.nonzero(nblocks * block_size < seq_lens)[0]
    if short.size:
        s = int(short[0])
        raise ValueError(f"sequence {s}: {nblocks[s]} blocks cannot hold {seq_lens[s]} tokens "
                         f"(block_size {block_size})")
    width = int(nblocks.max()) if pad_blocks_to is None else pad_blocks_to
    if width < nblocks.max():
        raise ValueError(f"pad_blocks_to={pad_blocks_to} is narrower than the longest block table")
    table = np.zeros((n, max(width, 1)), dtype=np.int32)
    for i, blocks in enumerate(block_tables):
        table[i, :len(blocks)] = blocks
    # NULL_BLOCK (-1): a block freed outside every layer's sliding window; block 0 stands in (never read:
    # the windowed masks and kernels skip those positions), so gathers stay in range
    np.maximum(table, 0, out=table)

    seq_index, positions = token_positions(computed, qlens)
    slots = slots_for_positions(table, seq_index, positions, block_size)
    qsl = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(qlens, out=qsl[1:])
    to = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    return AttentionMetadata(
        slot_mapping=to(slots),
        query_start_loc=to(qsl),
        seq_lens=to(seq_lens.astype(np.int32)),
        block_tables=to(table),
        max_query_len=int(qlens.max()),
        max_seq_len=int(seq_lens.max()),
        positions=to(positions),
        block_size=block_size,
    )
