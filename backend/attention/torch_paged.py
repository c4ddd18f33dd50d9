"""Paged attention in plain torch: the CPU path and the reference for the Triton kernels.

Per step, ``prepare`` turns the metadata into a ``PagedPlan``: which cache blocks to gather
for each sequence, where each flat query token sits in the padded ``[num_seqs, max_query_len]``
grid, and the boolean mask (causal by position, within length). Per layer, ``forward``
scatters the new K/V into their slots, gathers every sequence's context with one
``index_select`` over whole blocks, and runs ONE batched SDPA call for all sequences.

GQA without copies: the ``G = num_heads / num_kv_heads`` query heads sharing a KV head are
folded into the query-length axis (``[B, KVH, Qmax * G, D]`` against ``[B, KVH, S, D]``), so
keys and values are never repeated per query head.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..kv_cache import KVCache
from .base import AttentionBackend
from .metadata import AttentionMetadata


@dataclass
class PagedPlan:
    """Everything the layers of one step share (built once by ``plan_paged_attention``)."""

    num_seqs: int
    max_query_len: int
    ctx_len: int                    # keys gathered per sequence (>= max_seq_len, <= blocks * block_size)
    slot_mapping: torch.Tensor      # [num_tokens] int64
    gather_blocks: torch.Tensor     # [num_seqs * blocks_per_seq] int64  block ids, row-major
    query_rows: torch.Tensor | None  # [num_tokens] int64  row in the [num_seqs * max_query_len] grid; None: identity
    mask: torch.Tensor | None       # [num_seqs, 1, max_query_len, ctx_len] bool; None: attend to everything
    _folded_masks: dict = field(default_factory=dict)  # group size -> [num_seqs, 1, Qmax * G, ctx_len]

    def folded_mask(self, group: int) -> torch.Tensor | None:
        """The mask with each query row repeated ``group`` times (one per query head of a KV head)."""
        if self.mask is None or group == 1:
            return self.mask
        if group not in self._folded_masks:
            self._folded_masks[group] = self.mask.repeat_interleave(group, dim=2)
        return self._folded_masks[group]


def causal_position_mask(
    seq_lens: torch.Tensor,    # [num_seqs] context length after this step
    query_lens: torch.Tensor,  # [num_seqs] new tokens per sequence
    max_query_len: int,
    ctx_len: int,
) -> torch.Tensor:             # [num_seqs, max_query_len, ctx_len] bool
    """Query ``i`` of sequence ``s`` (position ``seq_len - query_len + i``) sees keys ``j <= position``.

    Padded query rows (``i >= query_len``) get a harmless non-empty row; their output is dropped.
    """
    pos = (seq_lens - query_lens)[:, None] + torch.arange(max_query_len, device=seq_lens.device)  # [S, Qmax]
    keys = torch.arange(ctx_len, device=seq_lens.device)
    return keys[None, None, :] <= pos[:, :, None]


def plan_paged_attention(md: AttentionMetadata, block_size: int) -> PagedPlan:
    """Precompute gather indices, query placement and mask for one step."""
    b = md.num_seqs
    seq_lens = md.seq_lens.long()
    qlens = (md.query_start_loc[1:] - md.query_start_loc[:-1]).long()
    blocks_per_seq = -(-md.max_seq_len // block_size)
    gather_blocks = md.block_tables[:, :blocks_per_seq].long().reshape(-1)
    ctx_len = md.max_seq_len
    qmax = md.max_query_len

    query_rows = None
    if b > 1 and qmax > 1:  # queries need a padded grid
        seq_of_token = torch.repeat_interleave(torch.arange(b, device=qlens.device), qlens)
        start = md.query_start_loc[:-1].long()
        query_rows = seq_of_token * qmax + torch.arange(md.num_tokens, device=qlens.device) - start[seq_of_token]

    if b == 1 and qmax == 1:
        mask = None  # one decode token: gather exactly seq_len keys, all visible
    elif qmax == 1:
        mask = (torch.arange(ctx_len, device=seq_lens.device)[None, :] < seq_lens[:, None])[:, None, None, :]
    else:
        mask = causal_position_mask(seq_lens, qlens, qmax, ctx_len)[:, None]
    return PagedPlan(b, qmax, ctx_len, md.slot_mapping.long(), gather_blocks, query_rows, mask)


def write_kv(
    cache: torch.Tensor,         # [num_blocks, block_size, num_kv_heads, head_dim]
    new: torch.Tensor,           # [num_tokens, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64
) -> None:
    """Store each new token's K (or V) in its slot."""
    cache.view(-1, *cache.shape[2:]).index_copy_(0, slot_mapping, new.to(cache.dtype))


def gather_context(
    cache: torch.Tensor,          # [num_blocks, block_size, num_kv_heads, head_dim]
    gather_blocks: torch.Tensor,  # [num_seqs * blocks_per_seq] int64
    num_seqs: int,
    ctx_len: int,
    out: torch.Tensor | None = None,  # [num_seqs * blocks_per_seq, block_size, num_kv_heads, head_dim] workspace
) -> torch.Tensor:                # [num_seqs, num_kv_heads, ctx_len, head_dim] (strided view)
    """Each sequence's keys (or values) in position order, one ``index_select`` over whole blocks.

    Pass a reused ``out`` buffer: gathering into fresh memory costs page faults that, on CPU,
    take several times longer than the copy itself.
    """
    blocks = torch.index_select(cache, 0, gather_blocks, out=out) if out is not None \
        else cache.index_select(0, gather_blocks)             # [B * nb, block_size, KVH, D]
    flat = blocks.view(num_seqs, -1, *cache.shape[2:])        # [B, nb * block_size, KVH, D]
    return flat[:, :ctx_len].transpose(1, 2)


def paged_attention(
    q: torch.Tensor,        # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    plan: PagedPlan,
    scale: float | None = None,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,  # K and V gather buffers (see gather_context)
) -> torch.Tensor:          # [num_tokens, num_heads, head_dim]
    """Attention of every new token over its sequence's cached keys, one SDPA call for the batch."""
    t, h, d = q.shape
    kvh = k_cache.shape[2]
    g = h // kvh
    b, qmax = plan.num_seqs, plan.max_query_len
    k_out, v_out = workspace if workspace is not None else (None, None)
    keys = gather_context(k_cache, plan.gather_blocks, b, plan.ctx_len, k_out)    # [B, KVH, S, D]
    values = gather_context(v_cache, plan.gather_blocks, b, plan.ctx_len, v_out)  # [B, KVH, S, D]
    q = q.to(keys.dtype)

    if qmax == 1:  # pure decode: token b is sequence b; fold the G heads into the query axis
        qf = q.view(b, kvh, g, d)                                           # [B, KVH, G, D]
        out = F.scaled_dot_product_attention(qf, keys, values, attn_mask=plan.mask, scale=scale)
        return out.reshape(t, h, d)

    if plan.query_rows is None:  # a single sequence: its tokens already form the grid
        grid = q.view(b, qmax, kvh, g, d)
    else:
        grid = q.new_zeros(b * qmax, h, d).index_copy_(0, plan.query_rows, q).view(b, qmax, kvh, g, d)
    qf = grid.permute(0, 2, 1, 3, 4).reshape(b, kvh, qmax * g, d)          # [B, KVH, Qmax * G, D]
    out = F.scaled_dot_product_attention(qf, keys, values, attn_mask=plan.folded_mask(g), scale=scale)
    out = out.view(b, kvh, qmax, g, d).permute(0, 2, 1, 3, 4).reshape(b * qmax, h, d)
    return out if plan.query_rows is None else out.index_select(0, plan.query_rows)


class TorchPagedAttention(AttentionBackend):
    """Paged attention over a ``KVCache`` in plain torch (any device; the CPU default).

    Keeps a grow-only gather workspace across steps (at most two contexts' worth of the
    largest batch seen), so each layer gathers into memory that is already mapped.
    """

    def __init__(self, kv_cache: KVCache, scale: float | None = None):
        self.kv_cache = kv_cache
        self.scale = scale
        self.plan: PagedPlan | None = None
        self._workspace = torch.empty(0, dtype=kv_cache.dtype, device=kv_cache.device)
        self._step_workspace: tuple[torch.Tensor, torch.Tensor] | None = None

    def _gather_workspace(self, num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.kv_cache
        shape = (num_blocks, c.block_size, c.num_kv_heads, c.head_dim)
        n = num_blocks * c.block_size * c.num_kv_heads * c.head_dim
        if self._workspace.numel() < 2 * n:
            self._workspace = torch.empty(2 * n, dtype=c.dtype, device=c.device)
        return self._workspace[:n].view(shape), self._workspace[n:2 * n].view(shape)

    def prepare(self, metadata: AttentionMetadata) -> None:
        if metadata.block_size and metadata.block_size != self.kv_cache.block_size:
            raise ValueError(f"metadata block_size {metadata.block_size} != cache block_size "
                             f"{self.kv_cache.block_size}")
        self.plan = plan_paged_attention(metadata, self.kv_cache.block_size)
        self._step_workspace = self._gather_workspace(self.plan.gather_blocks.numel())

    def forward(self, layer_idx, q, k, v):
        # q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim]
        if self.plan is None:
            raise RuntimeError("TorchPagedAttention.forward before prepare()")
        k_cache, v_cache = self.kv_cache.k[layer_idx], self.kv_cache.v[layer_idx]
        write_kv(k_cache, k, self.plan.slot_mapping)
        write_kv(v_cache, v, self.plan.slot_mapping)
        return paged_attention(q, k_cache, v_cache, self.plan, self.scale, self._step_workspace).to(q.dtype)
