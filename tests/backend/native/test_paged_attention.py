"""The native paged attention of the decode step (backend/native/csrc/paged_attention.cpp) against a float64 reference.

Through the ``paged_attention`` op (write_kv, then the attention, as ``decode_forward`` runs them per layer): random
q/k/v, shuffled block tables with block sizes that are and are not multiples of 16, decode tokens of many rows,
verify steps (T consecutive tokens of one row, each masked at its own position), rows interleaved, GQA with 1, 3
and 4 query heads per KV head, head dims on the tiled path (16..128) and on the per-token path (8, 24, 144),
contexts crossing block, 16-key tile and key-span boundaries; sliding windows (keys p - W < k <= p), with the blocks
wholly before every token's window freed (NULL_BLOCK, -1, in the table, junk in their old slots).
"""
from __future__ import annotations

import math

import pytest
import torch

from tests.helpers.paged_reference import random_layout


@pytest.fixture(scope="module")
def ops(native_lib):
    return native_lib


def make_step(rows_ctx: list[int], rows_tokens: list[int], order: list[int] | None, heads: int, kv_heads: int,
              head_dim: int, block_size: int, seed: int):
    """A step: row r has ``rows_ctx[r]`` cached keys and ``rows_tokens[r]`` new tokens at consecutive positions;
    ``order`` permutes the step's tokens (None: each row's tokens together, rows in order)."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-(c + t) // block_size) for c, t in zip(rows_ctx, rows_tokens)) + 3
    tables = random_layout(rows_ctx, rows_tokens, block_size, num_blocks, gen)
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    positions = torch.cat([torch.arange(c, c + t) for c, t in zip(rows_ctx, rows_tokens)])
    token_rows = torch.cat([torch.full((t,), r, dtype=torch.int32) for r, t in enumerate(rows_tokens)])
    if order is not None:
        positions, token_rows = positions[order], token_rows[order]
    qkv = torch.randn(len(positions), (heads + 2 * kv_heads) * head_dim, generator=gen) * 2.0  # peaked softmaxes too
    return qkv, positions.contiguous(), token_rows.contiguous(), block_tables, k_cache, v_cache


def reference(qkv, positions, token_rows, block_tables, k_cache, v_cache, heads, kv_heads, head_dim, scale, window=0):
    """Write each token's K/V into its slot, then float64 attention of each token over keys 0..pos of its row
    (``window`` > 0: keys pos - window < k <= pos)."""
    block_size = k_cache.shape[1]
    k_flat = k_cache.clone().reshape(-1, kv_heads, head_dim)
    v_flat = v_cache.clone().reshape(-1, kv_heads, head_dim)
    q = qkv[:, :heads * head_dim].reshape(-1, heads, head_dim)
    k_new = qkv[:, heads * head_dim:(heads + kv_heads) * head_dim].reshape(-1, kv_heads, head_dim)
    v_new = qkv[:, (heads + kv_heads) * head_dim:].reshape(-1, kv_heads, head_dim)
    slot_of = lambda row, pos: block_tables[row, pos // block_size].long() * block_size + pos % block_size
    for t in range(len(positions)):
        s = slot_of(int(token_rows[t]), positions[t])
        k_flat[s], v_flat[s] = k_new[t], v_new[t]
    out = torch.empty(len(positions), heads, head_dim, dtype=torch.float64)
    g = heads // kv_heads
    for t in range(len(positions)):
        first = max(0, int(positions[t]) - window + 1) if window else 0
        slots = slot_of(int(token_rows[t]), torch.arange(first, int(positions[t]) + 1))
        k = k_flat[slots].double().repeat_interleave(g, dim=1)   # [ctx, heads, head_dim]
        v = v_flat[slots].double().repeat_interleave(g, dim=1)
        p = (torch.einsum("hd,khd->hk", q[t].double(), k) * scale).softmax(-1)
        out[t] = torch.einsum("hk,khd->hd", p, v)
    return out.reshape(len(positions), heads * head_dim), k_flat.reshape(k_cache.shape), v_flat.reshape(v_cache.shape)


def free_outside_windows(tables, k_cache, v_cache, positions, token_rows, block_size, window):
    """As the block manager does when every layer has a window: each row's blocks wholly before the earliest window
    of its tokens become NULL_BLOCK (-1) and their old slots hold junk (NaN), which must never be read."""
    for row in range(tables.shape[0]):
        mine = positions[token_rows == row]
        if not len(mine):
            continue
        for b in range(max(0, int(mine.min()) - window + 1) // block_size):
            k_cache[tables[row, b]] = float("nan")
            v_cache[tables[row, b]] = float("nan")
            tables[row, b] = -1


def check(ops, rows_ctx, rows_tokens, heads, kv_heads, head_dim, block_size, order=None, seed=0, window=0):
    qkv, positions, token_rows, tables, k_cache, v_cache = make_step(rows_ctx, rows_tokens, order, heads, kv_heads,
                                                                     head_dim, block_size, seed)
    if window:
        free_outside_windows(tables, k_cache, v_cache, positions, token_rows, block_size, window)
    scale = 1.0 / math.sqrt(head_dim)
    want, want_k, want_v = reference(qkv, positions, token_rows, tables.clamp(min=0), k_cache, v_cache, heads,
                                     kv_heads, head_dim, scale, window)
    got = ops.paged_attention(qkv, positions, token_rows, tables, block_size, k_cache, v_cache, heads, kv_heads,
                              head_dim, scale, window)
    assert torch.equal(k_cache.nan_to_num(), want_k.nan_to_num()) and \
        torch.equal(v_cache.nan_to_num(), want_v.nan_to_num())   # write_kv: every token in its slot
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4)


HEADS = [(2, 2), (6, 2), (8, 2)]   # G = 1, 3, 4
HEAD_DIMS = [16, 32, 64, 128]


@pytest.mark.parametrize("heads, kv_heads", HEADS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("block_size", [5, 16, 32])
def test_verify_step_of_one_row(ops, heads, kv_heads, head_dim, block_size):
    """k + 1 tokens of one sequence at consecutive positions, contexts around tile and span boundaries."""
    for seed, (ctx, tokens) in enumerate([(0, 1), (14, 3), (15, 2), (31, 5), (100, 8), (250, 5), (509, 4)]):
        check(ops, [ctx], [tokens], heads, kv_heads, head_dim, block_size, seed=seed)


@pytest.mark.parametrize("heads, kv_heads", HEADS)
@pytest.mark.parametrize("head_dim", [16, 24, 32, 128])
@pytest.mark.parametrize("block_size", [4, 12, 16])
def test_decode_and_verify_rows_mixed(ops, heads, kv_heads, head_dim, block_size):
    """Decodes and verify steps of several rows in one step, rows in order and interleaved."""
    rows_ctx, rows_tokens = [0, 7, 16, 47, 130, 3, 64], [1, 5, 1, 3, 2, 1, 6]
    check(ops, rows_ctx, rows_tokens, heads, kv_heads, head_dim, block_size, seed=1)
    total = sum(rows_tokens)
    order = torch.randperm(total, generator=torch.Generator().manual_seed(2)).tolist()
    check(ops, rows_ctx, rows_tokens, heads, kv_heads, head_dim, block_size, order=order, seed=3)


@pytest.mark.parametrize("head_dim", [32, 64])
def test_long_group_splits(ops, head_dim):
    """More tokens of one row than one group takes (16), and more queries than one register chunk."""
    check(ops, [40], [37], 8, 2, head_dim, 16, seed=4)
    check(ops, [300], [20], 12, 3, head_dim, 7, seed=5)


@pytest.mark.parametrize("head_dim", [8, 24, 144])
def test_per_token_path(ops, head_dim):
    """Head dims the tiled kernel does not take (not a multiple of 16, or above 128)."""
    check(ops, [3, 90, 33], [1, 4, 2], 6, 2, head_dim, 16, seed=6)


def test_positions_out_of_order_within_a_row(ops):
    """One row's tokens need not be consecutive or ascending: each sees keys 0..its own position."""
    check(ops, [60], [6], 6, 2, 32, 16, order=[3, 0, 5, 1, 4, 2], seed=7)


def test_many_groups_over_threads(ops):
    """Enough work to fork: the split over (group, KV head) gives every item its own output."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        check(ops, [700] * 12, [1] * 8 + [4] * 4, 8, 2, 64, 16, seed=8)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("head_dim", [16, 64, 24])   # tiled (one span of 256 / 64 keys), and the per-token loop
@pytest.mark.parametrize("window", [1, 7, 16, 50])
def test_sliding_window(ops, head_dim, window):
    """Each token sees only keys p - W < k <= p: decodes, verify steps and long chunks whose windows start in
    different blocks and key spans, rows interleaved, the blocks before every window freed (-1, junk in them)."""
    rows_ctx, rows_tokens = [0, 9, 40, 300, 3, 130], [1, 5, 20, 3, 2, 17]
    check(ops, rows_ctx, rows_tokens, 6, 2, head_dim, 16, seed=10, window=window)
    order = torch.randperm(sum(rows_tokens), generator=torch.Generator().manual_seed(11)).tolist()
    check(ops, rows_ctx, rows_tokens, 8, 2, head_dim, 5, order=order, seed=12, window=window)


def test_window_output_does_not_depend_on_the_group(ops):
    """A token's windowed output is bit for bit the same alone as beside other tokens of its row (whose windows
    start earlier: the group's walk starts there)."""
    qkv, positions, rows, tables, k_cache, v_cache = make_step([290], [16], None, 6, 2, 64, 16, seed=13)
    args = (6, 2, 64, 0.125, 40)
    together = ops.paged_attention(qkv, positions, rows, tables, 16, k_cache.clone(), v_cache.clone(), *args)
    ops.paged_attention(qkv, positions, rows, tables, 16, k_cache, v_cache, *args)   # every token's K/V written
    alone = torch.cat([ops.paged_attention(qkv[t:t + 1], positions[t:t + 1], rows[t:t + 1], tables, 16, k_cache,
                                           v_cache, *args) for t in range(16)])
    assert torch.equal(together, alone)


def test_bad_arguments(ops):
    qkv, positions, rows, tables, k_cache, v_cache = make_step([5], [2], None, 6, 2, 32, 16, seed=9)
    with pytest.raises(RuntimeError, match="position out of range"):
        ops.paged_attention(qkv, -positions, rows, tables, 16, k_cache, v_cache, 6, 2, 32, 0.1)
    with pytest.raises(RuntimeError, match="qkv must be"):
        ops.paged_attention(qkv[:, 1:].contiguous(), positions, rows, tables, 16, k_cache, v_cache, 6, 2, 32, 0.1)
    with pytest.raises(RuntimeError, match="block table too narrow"):
        ops.paged_attention(qkv, positions + 64, rows, tables, 16, k_cache, v_cache, 6, 2, 32, 0.1)
    tables[0, 0] = -1   # a freed block that the token's window still reads
    with pytest.raises(RuntimeError, match="block id out of range"):
        ops.paged_attention(qkv, positions, rows, tables, 16, k_cache, v_cache, 6, 2, 32, 0.1, 8)
