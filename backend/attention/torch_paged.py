"""Paged attention in plain torch: the CPU path and the reference for the Triton kernels.

Per step, ``prepare`` turns the metadata into a ``PagedPlan``: which cache blocks to gather
for each sequence, where each flat query token sits in a padded ``[num_seqs, max_query_len]``
grid, and the boolean mask (causal by position, within length). Per layer, ``forward``
scatters the new K/V into their slots, gathers the contexts with one ``index_select`` over
whole blocks, and runs one batched SDPA call: no Python loop over sequences.

A mixed step is split into two groups, the decodes (one query each) and the rest, each
with its own SDPA call, so a long prefill chunk does not pad every decode to its length.

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
    """One SDPA call's worth of sequences; everything the layers of a step share."""

    num_seqs: int
    max_query_len: int
    ctx_len: int                      # keys gathered per sequence (the group's longest context)
    slot_mapping: torch.Tensor        # [num_tokens_in_step] int64
    gather_blocks: torch.Tensor       # [num_seqs * blocks_per_seq] int64  block ids, row-major
    query_rows: torch.Tensor | None   # [num_tokens] int64  row in the [num_seqs * max_query_len] grid; None: identity
    mask: torch.Tensor | None         # [num_seqs, 1, max_query_len, ctx_len] bool; None: attend to everything
    token_index: torch.Tensor | None = None  # [num_tokens] int64  this group's tokens in the step; None: all
    rest: "PagedPlan | None" = None   # the other group of a mixed step (decodes here, the rest there)
    _folded_masks: dict = field(default_factory=dict)  # group size -> [num_seqs, 1, Qmax * G, ctx_len]

    def folded_mask(self, group: int) -> torch.Tensor | None:
        """The mask with each query row repeated ``group`` times (one per query head of a KV head)."""
        if self.mask is None or group == 1 or self.max_query_len == 1:
            return self.mask
        if group not in self._folded_masks:
            self._folded_masks[group] = self.mask.repeat_interleave(group, dim=2)
        return self._folded_masks[group]

    @property
    def groups(self) -> list["PagedPlan"]:
        return [self] if self.rest is None else [self, self.rest]


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


def plan_group(
    seq_lens: torch.Tensor,      # [num_seqs] int64
    query_lens: torch.Tensor,    # [num_seqs] int64
    block_tables: torch.Tensor,  # [num_seqs, max_blocks]
    slot_mapping: torch.Tensor,  # [num_tokens_in_step] int64
    token_index: torch.Tensor | None,  # [num_tokens] this group's tokens in the step (None: all, in order)
    block_size: int,
) -> PagedPlan:
    b = seq_lens.shape[0]
    dev = seq_lens.device
    ctx_len = int(seq_lens.max())
    qmax = int(query_lens.max())
    gather_blocks = block_tables[:, :-(-ctx_len // block_size)].long().reshape(-1)
    query_rows = None
    if b > 1 and qmax > 1:  # queries need a padded grid
        seq_of_token = torch.repeat_interleave(torch.arange(b, device=dev), query_lens)
        start = torch.cumsum(query_lens, 0) - query_lens
        query_rows = seq_of_token * qmax + torch.arange(seq_of_token.shape[0], device=dev) - start[seq_of_token]
    if b == 1 and qmax == 1:
        mask = None  # one decode token: gather exactly seq_len keys, all visible
    elif qmax == 1:
        mask = (torch.arange(ctx_len, device=dev)[None, :] < seq_lens[:, None])[:, None, None, :]
    else:
        mask = causal_position_mask(seq_lens, query_lens, qmax, ctx_len)[:, None]
    return PagedPlan(b, qmax, ctx_len, slot_mapping, gather_blocks, query_rows, mask, token_index)


def plan_paged_attention(md: AttentionMetadata, block_size: int) -> PagedPlan:
    """Precompute gather indices, query placement and masks for one step."""
    seq_lens = md.seq_lens.long()
    qsl = md.query_start_loc.long()
    qlens = qsl[1:] - qsl[:-1]
    slots = md.slot_mapping.long()
    is_decode = qlens == 1
    num_decodes = int(is_decode.sum())
    if md.max_query_len == 1 or num_decodes == 0:
        return plan_group(seq_lens, qlens, md.block_tables, slots, None, block_size)
    dec = is_decode.nonzero().flatten()
    pre = (~is_decode).nonzero().flatten()
    pre_tokens = torch.repeat_interleave(qsl[:-1][pre] - torch.cumsum(qlens[pre], 0) + qlens[pre], qlens[pre]) \
        + torch.arange(int(qlens[pre].sum()), device=qsl.device)
    plan = plan_group(seq_lens[dec], qlens[dec], md.block_tables[dec], slots, qsl[:-1][dec], block_size)
    plan.rest = plan_group(seq_lens[pre], qlens[pre], md.block_tables[pre], slots, pre_tokens, block_size)
    return plan


def write_kv(
    cache_flat: torch.Tensor,    # [num_blocks * block_size, num_kv_heads, head_dim]
    new: torch.Tensor,           # [num_tokens, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64
) -> None:
    """Store each new token's K (or V) in its slot."""
    cache_flat.index_copy_(0, slot_mapping, new if new.dtype == cache_flat.dtype else new.to(cache_flat.dtype))


def context_view(
    blocks: torch.Tensor,  # [num_seqs * blocks_per_seq, block_size, num_kv_heads, head_dim] gathered blocks
    num_seqs: int,
    ctx_len: int,
) -> torch.Tensor:         # [num_seqs, num_kv_heads, ctx_len, head_dim] (strided view)
    flat = blocks.view(num_seqs, -1, *blocks.shape[2:])  # [B, blocks_per_seq * block_size, KVH, D]
    return flat[:, :ctx_len].transpose(1, 2)


def gather_context(
    cache: torch.Tensor,          # [num_blocks, block_size, num_kv_heads, head_dim]
    gather_blocks: torch.Tensor,  # [num_seqs * blocks_per_seq] int64
    num_seqs: int,
    ctx_len: int,
) -> torch.Tensor:                # [num_seqs, num_kv_heads, ctx_len, head_dim] (strided view)
    """Each sequence's keys (or values) in position order, one ``index_select`` over whole blocks."""
    return context_view(cache.index_select(0, gather_blocks), num_seqs, ctx_len)


def attend(
    q: torch.Tensor,       # [num_tokens, num_heads, head_dim]
    keys: torch.Tensor,    # [num_seqs, num_kv_heads, ctx_len, head_dim]
    values: torch.Tensor,  # [num_seqs, num_kv_heads, ctx_len, head_dim]
    plan: PagedPlan,
    scale: float | None = None,
) -> torch.Tensor:         # [num_tokens, num_heads, head_dim]
    """One SDPA call for the whole batch, the query-head group folded into the query axis."""
    t, h, d = q.shape
    b, kvh, qmax = plan.num_seqs, keys.shape[1], plan.max_query_len
    g = h // kvh
    if q.dtype != keys.dtype:
        q = q.to(keys.dtype)
    if qmax == 1:  # pure decode: token i is sequence i, no padding at all
        out = F.scaled_dot_product_attention(q.view(b, kvh, g, d), keys, values, attn_mask=plan.mask, scale=scale)
        return out.view(t, h, d)
    if plan.query_rows is None:  # a single sequence: its tokens already form the grid
        grid = q.view(b, qmax, kvh, g, d)
    else:
        grid = q.new_zeros(b * qmax, h, d).index_copy_(0, plan.query_rows, q).view(b, qmax, kvh, g, d)
    qf = grid.permute(0, 2, 1, 3, 4).reshape(b, kvh, qmax * g, d)          # [B, KVH, Qmax * G, D]
    out = F.scaled_dot_product_attention(qf, keys, values, attn_mask=plan.folded_mask(g), scale=scale)
    out = out.view(b, kvh, qmax, g, d).permute(0, 2, 1, 3, 4).reshape(b * qmax, h, d)
    return out if plan.query_rows is None else out.index_select(0, plan.query_rows)


def attend_groups(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    plan: PagedPlan,
    contexts: list[tuple[torch.Tensor, torch.Tensor]],  # per group: keys, values [B_g, KVH, S_g, D]
    scale: float | None,
) -> torch.Tensor:    # [num_tokens, num_heads, head_dim]
    if plan.rest is None:
        return attend(q, *contexts[0], plan, scale)
    out = torch.empty(q.shape, dtype=contexts[0][0].dtype, device=q.device)
    for group, (keys, values) in zip(plan.groups, contexts):
        out.index_copy_(0, group.token_index, attend(q.index_select(0, group.token_index), keys, values, group, scale))
    return out


def paged_attention(
    q: torch.Tensor,        # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    plan: PagedPlan,
    scale: float | None = None,
) -> torch.Tensor:          # [num_tokens, num_heads, head_dim]
    """Attention of every new token over its sequence's cached keys (functional form)."""
    contexts = [(gather_context(k_cache, g.gather_blocks, g.num_seqs, g.ctx_len),
                 gather_context(v_cache, g.gather_blocks, g.num_seqs, g.ctx_len)) for g in plan.groups]
    return attend_groups(q, plan, contexts, scale)


class TorchPagedAttention(AttentionBackend):
    """Paged attention over a ``KVCache`` in plain torch (any device; the CPU default).

    Per layer: two ``index_copy_`` (new K, V), two ``index_select`` per group into a workspace,
    one SDPA per group. The workspace is grow-only and kept across steps (gathering into fresh
    memory costs page faults that take longer than the copy itself); its views for the step
    are made once in ``prepare``.
    """

    def __init__(self, kv_cache: KVCache, scale: float | None = None):
        self.kv_cache = kv_cache
        self.scale = scale
        self.plan: PagedPlan | None = None
        c = kv_cache
        self._k_flat = [k.view(-1, c.num_kv_heads, c.head_dim) for k in c.k]  # [num_slots, KVH, D] per layer
        self._v_flat = [v.view(-1, c.num_kv_heads, c.head_dim) for v in c.v]
        self._workspace = torch.empty(0, dtype=c.dtype, device=c.device)
        self._bufs: list[tuple[torch.Tensor, ...]] = []  # per group: k_blocks, v_blocks, keys, values

    def _step_buffers(self, plan: PagedPlan) -> list[tuple[torch.Tensor, ...]]:
        c = self.kv_cache
        per_block = c.block_size * c.num_kv_heads * c.head_dim
        need = sum(2 * g.gather_blocks.numel() * per_block for g in plan.groups)
        if self._workspace.numel() < need:
            self._workspace = torch.empty(need, dtype=c.dtype, device=c.device)
        bufs, at = [], 0
        for g in plan.groups:
            n = g.gather_blocks.numel() * per_block
            shape = (g.gather_blocks.numel(), c.block_size, c.num_kv_heads, c.head_dim)
            k_blocks = self._workspace[at:at + n].view(shape)          # [B * nb, block_size, KVH, D]
            v_blocks = self._workspace[at + n:at + 2 * n].view(shape)
            at += 2 * n
            bufs.append((k_blocks, v_blocks, context_view(k_blocks, g.num_seqs, g.ctx_len),
                         context_view(v_blocks, g.num_seqs, g.ctx_len)))
        return bufs

    def prepare(self, metadata: AttentionMetadata) -> None:
        if metadata.block_size and metadata.block_size != self.kv_cache.block_size:
            raise ValueError(f"metadata block_size {metadata.block_size} != cache block_size "
                             f"{self.kv_cache.block_size}")
        self.plan = plan_paged_attention(metadata, self.kv_cache.block_size)
        self._bufs = self._step_buffers(self.plan)

    def forward(self, layer_idx, q, k, v):
        # q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim]
        plan = self.plan
        if plan is None:
            raise RuntimeError("TorchPagedAttention.forward before prepare()")
        write_kv(self._k_flat[layer_idx], k, plan.slot_mapping)
        write_kv(self._v_flat[layer_idx], v, plan.slot_mapping)
        k_cache, v_cache = self.kv_cache.k[layer_idx], self.kv_cache.v[layer_idx]
        for group, (k_blocks, v_blocks, _, _) in zip(plan.groups, self._bufs):
            torch.index_select(k_cache, 0, group.gather_blocks, out=k_blocks)
            torch.index_select(v_cache, 0, group.gather_blocks, out=v_blocks)
        out = attend_groups(q, plan, [(keys, values) for _, _, keys, values in self._bufs], self.scale)
        return out if out.dtype == q.dtype else out.to(q.dtype)
