"""Shared helpers for paged-attention tests: random paged layouts and a naive dense reference."""
from __future__ import annotations

import math

import torch

from backend.attention.metadata import build_attention_metadata


def random_layout(ctx_lens, query_lens, block_size, num_blocks, gen):
    """Block tables (distinct random blocks per sequence, shuffled) covering ctx + query tokens."""
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, at = [], 0
    for c, q in zip(ctx_lens, query_lens):
        n = -(-(c + q) // block_size)
        tables.append(perm[at:at + n])
        at += n
    assert at <= num_blocks, "test layout needs more blocks"
    return tables


def fill_context(k_cache, v_cache, tables, ctx_lens, full_k, full_v, block_size):
    """Write each sequence's cached prefix (the first ctx tokens of full_k/v) into its blocks."""
    for s, (table, c) in enumerate(zip(tables, ctx_lens)):
        for p in range(c):
            blk, off = table[p // block_size], p % block_size
            k_cache[blk, off] = full_k[s][p]
            v_cache[blk, off] = full_v[s][p]


def naive_attention(q, k, v, ctx, window=None):
    """Dense attention of the last ``len(q)`` tokens over all ``len(k)`` tokens, causal by position
    (and, with ``window``, only keys ``p - window < k <= p``, transformers' sliding window).

    q [Q, H, D], k/v [S, KVH, D] with S = ctx + Q; returns [Q, H, D] in fp64 maths.
    """
    qd, kd, vd = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    kd = kd.repeat_interleave(g, dim=1)
    vd = vd.repeat_interleave(g, dim=1)
    scores = torch.einsum("qhd,khd->hqk", qd, kd) / math.sqrt(q.shape[-1])
    qpos = ctx + torch.arange(q.shape[0])
    allowed = torch.arange(k.shape[0])[None, :] <= qpos[:, None]
    if window is not None:
        allowed &= torch.arange(k.shape[0])[None, :] > qpos[:, None] - window
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vd)


def make_case(ctx_lens, query_lens, *, num_heads, num_kv_heads, head_dim, block_size, dtype=torch.float32,
              seed=0, extra_blocks=3, window=None):
    """Random q, new k/v, a cache holding the prefixes, metadata and the expected output
    (of a layer with sliding ``window``, when given)."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-(c + q) // block_size) for c, q in zip(ctx_lens, query_lens)) + extra_blocks
    tables = random_layout(ctx_lens, query_lens, block_size, num_blocks, gen)
    full_k = [torch.randn(c + q, num_kv_heads, head_dim, generator=gen) for c, q in zip(ctx_lens, query_lens)]
    full_v = [torch.randn(c + q, num_kv_heads, head_dim, generator=gen) for c, q in zip(ctx_lens, query_lens)]
    qs = [torch.randn(q, num_heads, head_dim, generator=gen) for q in query_lens]
    k_cache = torch.zeros(num_blocks, block_size, num_kv_heads, head_dim)
    v_cache = torch.zeros_like(k_cache)
    fill_context(k_cache, v_cache, tables, ctx_lens, full_k, full_v, block_size)
    md = build_attention_metadata(ctx_lens, query_lens, tables, block_size)
    q = torch.cat(qs)
    k_new = torch.cat([fk[c:] for fk, c in zip(full_k, ctx_lens)])
    v_new = torch.cat([fv[c:] for fv, c in zip(full_v, ctx_lens)])
    expected = torch.cat([naive_attention(qi, fk, fv, c, window)
                          for qi, fk, fv, c in zip(qs, full_k, full_v, ctx_lens)]).float()
    cast = lambda t: t.to(dtype)  # noqa: E731
    return dict(q=cast(q), k=cast(k_new), v=cast(v_new), k_cache=cast(k_cache), v_cache=cast(v_cache), md=md,
                expected=expected, num_blocks=num_blocks, full_k=full_k, full_v=full_v, tables=tables)
