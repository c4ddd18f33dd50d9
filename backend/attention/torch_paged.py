"""Paged attention in plain torch: the CPU path and the reference for the Triton kernels.

Per step, ``prepare`` turns the metadata into a ``PagedPlan``: which cache blocks to gather
for each sequence and the masks. Per layer, ``forward`` scatters the new K/V into their
slots and gathers the contexts with one ``index_select`` over whole blocks.

A step is split into two groups. Decodes (one query each, the hot path) run as ONE batched
SDPA call: the ``G = num_heads / num_kv_heads`` query heads sharing a KV head are folded into
the query axis (``[B, KVH, G, D]`` against ``[B, KVH, S, D]``), so K/V are never repeated per
head. Sequences with several query tokens (prefill chunks, prefix hits, drafts) run one causal
SDPA each over exactly their own context: padding them to the longest one in a batched call
cost ~3x the attention FLOPs on mixed prompt lengths, and a fresh prompt gets the flash
``is_causal`` path with no mask at all. Those few calls per step are compute-bound.

A quantized cache (``kv_cache_dtype`` int8) is written through ``quantize_per_token_head`` (codes and
one fp16 scale per token and head) and read by ``gather_dequantized``: the blocks' codes and scales
are gathered into staging buffers and dequantized into the same workspace the unquantized path
gathers into, so attention itself never sees the format.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from backend.attention.base import AttentionBackend
from backend.attention.metadata import AttentionMetadata
from backend.attention.window import causal_mask, decode_mask
from backend.core.kv_cache import KVCache
from backend.core.kv_quant import KVFormat, as_bytes, dequantize_into, quantize_per_token_head


@dataclass
class PagedPlan:
    """One SDPA call's worth of sequences; everything the layers of a step share."""

    num_seqs: int
    max_query_len: int
    ctx_len: int                      # keys gathered per sequence (the group's longest context)
    slot_mapping: torch.Tensor        # [num_tokens_in_step] int64
    gather_blocks: torch.Tensor       # [num_seqs * blocks_per_seq] int64  block ids, row-major
    mask: torch.Tensor | None         # decodes: [num_seqs, 1, 1, ctx_len] bool; None: attend to everything
    token_index: torch.Tensor | None = None  # [num_tokens] int64  this group's tokens in the step; None: all
    rest: "PagedPlan | None" = None   # the other group of a mixed step (decodes here, the rest there)
    # multi-token groups: per sequence (query_len, context_len), and its causal mask [query_len, context_len]
    # aligned bottom-right (None when query_len == context_len: plain is_causal)
    seq_shapes: list[tuple[int, int]] = field(default_factory=list)
    seq_masks: list[torch.Tensor | None] = field(default_factory=list)

    @property
    def groups(self) -> list["PagedPlan"]:
        return [self] if self.rest is None else [self, self.rest]


def plan_group(
    seq_lens: torch.Tensor,      # [num_seqs] int64
    query_lens: torch.Tensor,    # [num_seqs] int64
    block_tables: torch.Tensor,  # [num_seqs, max_blocks]
    slot_mapping: torch.Tensor,  # [num_tokens_in_step] int64
    token_index: torch.Tensor | None,  # [num_tokens] this group's tokens in the step (None: all, in order)
    block_size: int,
    window: int | None = None,   # sliding window of the layers this plan serves (backend/attention/window.py)
) -> PagedPlan:
    b = seq_lens.shape[0]
    dev = seq_lens.device
    ctx_len = int(seq_lens.max())
    qmax = int(query_lens.max())
    gather_blocks = block_tables[:, :-(-ctx_len // block_size)].long().reshape(-1)
    if qmax == 1:
        return PagedPlan(b, qmax, ctx_len, slot_mapping, gather_blocks, decode_mask(seq_lens, ctx_len, window),
                         token_index)
    shapes = list(zip(query_lens.tolist(), seq_lens.tolist()))
    masks = [causal_mask(ql, sl, window, dev) for ql, sl in shapes]
    return PagedPlan(b, qmax, ctx_len, slot_mapping, gather_blocks, None, token_index, seq_shapes=shapes,
                     seq_masks=masks)


def plan_paged_attention(md: AttentionMetadata, block_size: int, window: int | None = None) -> PagedPlan:
    """Precompute gather indices, query placement and masks for one step (of layers with ``window``)."""
    seq_lens = md.seq_lens.long()
    qsl = md.query_start_loc.long()
    qlens = qsl[1:] - qsl[:-1]
    slots = md.slot_mapping.long()
    is_decode = qlens == 1
    num_decodes = int(is_decode.sum())
    if md.max_query_len == 1 or num_decodes == 0:
        return plan_group(seq_lens, qlens, md.block_tables, slots, None, block_size, window)
    dec = is_decode.nonzero().flatten()
    pre = (~is_decode).nonzero().flatten()
    pre_tokens = torch.repeat_interleave(qsl[:-1][pre] - torch.cumsum(qlens[pre], 0) + qlens[pre], qlens[pre]) \
        + torch.arange(int(qlens[pre].sum()), device=qsl.device)
    plan = plan_group(seq_lens[dec], qlens[dec], md.block_tables[dec], slots, qsl[:-1][dec], block_size, window)
    plan.rest = plan_group(seq_lens[pre], qlens[pre], md.block_tables[pre], slots, pre_tokens, block_size, window)
    return plan


def write_kv(
    cache_flat: torch.Tensor,    # [num_blocks * block_size, num_kv_heads, head_dim]
    new: torch.Tensor,           # [num_tokens, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64
) -> None:
    """Store each new token's K (or V) in its slot."""
    cache_flat.index_copy_(0, slot_mapping, new if new.dtype == cache_flat.dtype else new.to(cache_flat.dtype))


def write_kv_quantized(
    codes: torch.Tensor,         # [2, num_blocks * block_size, num_kv_heads, head_dim] int8 / float8: one layer's K, V
    scales: torch.Tensor,        # [2, num_blocks * block_size, num_kv_heads] fp16
    k: torch.Tensor,             # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,             # [num_tokens, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64
    fmt: KVFormat,
) -> None:
    """Store each new token's quantized K and V and their per-head scales in its slot (K and V in one pass:
    on the CPU a decode step's tensors are tiny and each op's fixed cost dominates)."""
    q, scale = quantize_per_token_head(torch.stack((k, v)), fmt)   # [2, T, KVH, D], [2, T, KVH]
    as_bytes(codes).index_copy_(1, slot_mapping, as_bytes(q))
    scales.index_copy_(1, slot_mapping, scale)


def gather_dequantized(
    codes: torch.Tensor,          # [2, num_blocks, block_size, num_kv_heads, head_dim] int8 / float8: a layer's K, V
    scales: torch.Tensor,         # [2, num_blocks, block_size, num_kv_heads] fp16
    gather_blocks: torch.Tensor,  # [num_gathered] int64
    out: torch.Tensor,            # [2, num_gathered, block_size, num_kv_heads, head_dim] compute dtype
    staged_codes: torch.Tensor,   # [2, num_gathered, block_size, num_kv_heads, head_dim] staging, cache dtype
    staged_scales: torch.Tensor,  # [2, num_gathered, block_size, num_kv_heads] staging, fp16
) -> torch.Tensor:                # out
    """The gathered K and V blocks of a quantized cache, dequantized into ``out`` (gathered along the block axis
    of K and of V separately: torch's index_select along a later axis is ~15x slower on the CPU)."""
    for i in range(2):
        torch.index_select(as_bytes(codes[i]), 0, gather_blocks, out=as_bytes(staged_codes[i]))
        torch.index_select(scales[i], 0, gather_blocks, out=staged_scales[i])
    return dequantize_into(out, staged_codes, staged_scales)


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
    """Decodes: one SDPA call for the whole group, the query-head group folded into the query axis."""
    t, h, d = q.shape
    b, kvh, qmax = plan.num_seqs, keys.shape[1], plan.max_query_len
    g = h // kvh
    if q.dtype != keys.dtype:
        q = q.to(keys.dtype)
    if qmax == 1:  # pure decode: token i is sequence i, no padding at all
        out = F.scaled_dot_product_attention(q.view(b, kvh, g, d), keys, values, attn_mask=plan.mask, scale=scale)
        return out.view(t, h, d)
    # several query tokens per sequence (prefill chunks, prefix hits, drafts): one causal SDPA per
    # sequence over its own context, with no padding to the longest one (decodes stay batched above)
    outs, start = [], 0
    for i, ((qlen, ctx), mask) in enumerate(zip(plan.seq_shapes, plan.seq_masks)):
        qi = q[start:start + qlen].transpose(0, 1).unsqueeze(0)           # [1, H, qlen, D]
        ki, vi = keys[i:i + 1, :, :ctx], values[i:i + 1, :, :ctx]          # [1, KVH, ctx, D]
        o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, is_causal=mask is None, scale=scale,
                                           enable_gqa=g > 1)
        outs.append(o[0].transpose(0, 1))                                  # [qlen, H, D]
        start += qlen
    return outs[0] if len(outs) == 1 else torch.cat(outs)


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

    def __init__(self, kv_cache: KVCache, scale: float | None = None, windows=None):
        """``windows``: per layer, a sliding window or None (default: none anywhere)."""
        self.kv_cache = kv_cache
        self.scale = scale
        self.windows = tuple(windows) if windows else (None,) * kv_cache.num_layers
        self.plan: PagedPlan | None = None
        self._window_plans: dict[int, PagedPlan] = {}   # window -> the step's plan for layers with it
        c = kv_cache
        self._k_flat = [k.view(-1, c.num_kv_heads, c.head_dim) for k in c.k]  # [num_slots, KVH, D] per layer
        self._v_flat = [v.view(-1, c.num_kv_heads, c.head_dim) for v in c.v]
        self._workspace = torch.empty(0, dtype=c.dtype, device=c.device)
        self._bufs: list[tuple[torch.Tensor, ...]] = []  # per group: k_blocks, v_blocks, keys, values
        self._quantized = c.format.quantized
        if self._quantized:
            # per layer, K and V together: codes [2, num_blocks, block_size, KVH, D], scales [2, num_blocks, bs, KVH]
            self._layer_codes = [c.data[:, layer] for layer in range(c.num_layers)]
            self._layer_scales = [c.scales[:, layer] for layer in range(c.num_layers)]
            self._codes = torch.empty(0, dtype=c.format.storage, device=c.device)   # staging of gathered codes
            self._code_scales = torch.empty(0, dtype=c.scales.dtype, device=c.device)
            self._staging: list[tuple[torch.Tensor, ...]] = []  # per group: K+V blocks out, codes, scales views

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
        if self._quantized:
            self._staging = self._staging_buffers(plan)
        return bufs

    def _staging_buffers(self, plan: PagedPlan) -> list[tuple[torch.Tensor, ...]]:
        """Per group: the K+V view of its gather workspace (K blocks then V blocks, adjacent), and where a
        layer's gathered codes and scales land before dequantization."""
        c = self.kv_cache
        per_block = c.block_size * c.num_kv_heads * c.head_dim
        most = max(g.gather_blocks.numel() for g in plan.groups)
        if self._codes.numel() < 2 * most * per_block:
            self._codes = torch.empty(2 * most * per_block, dtype=self._codes.dtype, device=c.device)
            self._code_scales = torch.empty(2 * most * c.block_size * c.num_kv_heads, dtype=self._code_scales.dtype,
                                            device=c.device)
        out, at = [], 0
        for g in plan.groups:
            n = g.gather_blocks.numel()
            shape = (2, n, c.block_size, c.num_kv_heads, c.head_dim)
            out.append((self._workspace[at:at + 2 * n * per_block].view(shape),
                        self._codes[:2 * n * per_block].view(shape),
                        self._code_scales[:2 * n * c.block_size * c.num_kv_heads].view(shape[:-1])))
            at += 2 * n * per_block
        return out

    def prepare(self, metadata: AttentionMetadata) -> None:
        if metadata.block_size and metadata.block_size != self.kv_cache.block_size:
            raise ValueError(f"metadata block_size {metadata.block_size} != cache block_size "
                             f"{self.kv_cache.block_size}")
        self.plan = plan_paged_attention(metadata, self.kv_cache.block_size)
        self._window_plans = {w: plan_paged_attention(metadata, self.kv_cache.block_size, w)
                              for w in set(self.windows) if w is not None}   # same gathers, windowed masks
        self._bufs = self._step_buffers(self.plan)

    def forward(self, layer_idx, q, k, v):
        # q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim]
        window = self.windows[layer_idx]
        plan = self.plan if window is None else self._window_plans.get(window)
        if plan is None:
            raise RuntimeError("TorchPagedAttention.forward before prepare()")
        if self._quantized:
            self._write_and_gather_quantized(layer_idx, k, v, plan)
        else:
            write_kv(self._k_flat[layer_idx], k, plan.slot_mapping)
            write_kv(self._v_flat[layer_idx], v, plan.slot_mapping)
            k_cache, v_cache = self.kv_cache.k[layer_idx], self.kv_cache.v[layer_idx]
            for group, (k_blocks, v_blocks, _, _) in zip(plan.groups, self._bufs):
                torch.index_select(k_cache, 0, group.gather_blocks, out=k_blocks)
                torch.index_select(v_cache, 0, group.gather_blocks, out=v_blocks)
        out = attend_groups(q, plan, [(keys, values) for _, _, keys, values in self._bufs], self.scale)
        return out if out.dtype == q.dtype else out.to(q.dtype)

    def _write_and_gather_quantized(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor, plan: PagedPlan) -> None:
        # k, v: [num_tokens, num_kv_heads, head_dim]
        c = self.kv_cache
        codes, scales = self._layer_codes[layer_idx], self._layer_scales[layer_idx]
        write_kv_quantized(codes.flatten(1, 2), scales.flatten(1, 2), k, v, plan.slot_mapping, c.format)
        for group, (kv_blocks, staged_codes, staged_scales) in zip(plan.groups, self._staging):
            gather_dequantized(codes, scales, group.gather_blocks, kv_blocks, staged_codes, staged_scales)
