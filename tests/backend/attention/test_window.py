"""Sliding-window attention in the torch path: masks, the paged backend against naive windowed
attention, per-layer windows, and blocks freed outside the window (NULL entries) never read."""
import zlib

import pytest
import torch

from backend.attention.dense import DenseCausalAttention
from backend.attention.metadata import build_attention_metadata
from backend.attention.torch_paged import TorchPagedAttention
from backend.attention.window import causal_mask, decode_mask, serving_windows, uniform_window
from backend.core.block_manager import NULL_BLOCK
from backend.core.kv_cache import KVCache
from tests.helpers.paged_reference import make_case, naive_attention

CASES = {
    # name: (ctx_lens, query_lens)
    "decode_batch": ([0, 5, 16, 17, 40], [1, 1, 1, 1, 1]),
    "prefill_longer_than_window": ([0], [23]),
    "chunk_after_window": ([32], [7]),
    "mixed": ([20, 0, 5, 33], [1, 9, 4, 1]),
    "verify_drafts": ([11, 29], [4, 4]),
}


def test_masks_follow_transformers_definition():
    # transformers' sliding_window_overlay: kv_idx > q_idx - window (and causal kv_idx <= q_idx)
    m = causal_mask(3, 10, 4)
    for i, qpos in enumerate(range(7, 10)):
        assert m[i].nonzero().flatten().tolist() == list(range(qpos - 3, qpos + 1))
    assert causal_mask(5, 5, None) is None and causal_mask(5, 5, 5) is None   # the window cannot bind
    assert causal_mask(5, 5, 4) is not None
    d = decode_mask(torch.tensor([3, 9]), 9, 4)[:, 0, 0]
    assert d[0].nonzero().flatten().tolist() == [0, 1, 2]
    assert d[1].nonzero().flatten().tolist() == [5, 6, 7, 8]
    assert decode_mask(torch.tensor([3]), 3, 4) is None


def test_serving_windows():
    assert serving_windows((), 3, 100) == (None, None, None)
    assert serving_windows((64, None, 64), 3, 100) == (64, None, 64)
    assert serving_windows((64, 64), 2, 64) == (None, None)      # never binds within the context
    assert uniform_window((64, 32)) == 64 and uniform_window((64, None)) is None and uniform_window(()) is None


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("block_size,window", [(4, 6), (16, 5), (4, 1)])
def test_paged_window_matches_naive(name, heads, kv_heads, block_size, window):
    ctx, ql = CASES[name]
    case = make_case(ctx, ql, num_heads=heads, num_kv_heads=kv_heads, head_dim=16, block_size=block_size,
                     seed=zlib.crc32(f"{name}{heads}{block_size}{window}".encode()), window=window)
    cache = KVCache(2, case["num_blocks"], block_size, kv_heads, 16)
    for layer in (0, 1):
        cache.k[layer].copy_(case["k_cache"])
        cache.v[layer].copy_(case["v_cache"])
    attn = TorchPagedAttention(cache, windows=(None, window))
    attn.prepare(case["md"])
    torch.testing.assert_close(attn.forward(1, case["q"], case["k"], case["v"]), case["expected"],
                               atol=2e-5, rtol=1e-4)
    # layer 0 has no window: plain causal attention over the same cache
    full = torch.cat([naive_attention(q, fk, fv, c) for q, fk, fv, c in
                      zip(case["q"].split(ql), case["full_k"], case["full_v"], ctx)]).float()
    torch.testing.assert_close(attn.forward(0, case["q"], case["k"], case["v"]), full, atol=2e-5, rtol=1e-4)


def test_freed_blocks_are_never_read():
    """Blocks before the window replaced by NULL_BLOCK (and their old slots filled with junk): same output."""
    bs, window = 4, 6
    case = make_case([30, 17], [1, 3], num_heads=4, num_kv_heads=2, head_dim=8, block_size=bs, window=window)
    tables = [list(t) for t in case["tables"]]
    for t, (c, q) in zip(tables, [(30, 1), (17, 3)]):
        first_needed = c - window + 1                      # the first key the earliest new query sees
        for i in range(first_needed // bs):
            case["k_cache"][t[i]] = 1e4                   # junk: any read would show
            case["v_cache"][t[i]] = -1e4
            t[i] = NULL_BLOCK
    md = build_attention_metadata([30, 17], [1, 3], tables, bs)
    assert int(md.block_tables.min()) == 0                 # NULL entries become a valid index
    cache = KVCache(1, case["num_blocks"], bs, 2, 8)
    cache.k[0].copy_(case["k_cache"])
    cache.v[0].copy_(case["v_cache"])
    live = {b for t in tables for b in t if b != NULL_BLOCK}
    if 0 not in live:
        cache.k[0][0] = 1e4                                # block 0 stands in for NULL: junk there too
    attn = TorchPagedAttention(cache, windows=(window,))
    attn.prepare(md)
    torch.testing.assert_close(attn.forward(0, case["q"], case["k"], case["v"]), case["expected"],
                               atol=2e-5, rtol=1e-4)


def test_dense_attention_windows():
    torch.manual_seed(0)
    s, h, kvh, d, w = 12, 4, 2, 8, 5
    q, k, v = torch.randn(s, h, d), torch.randn(s, kvh, d), torch.randn(s, kvh, d)
    out = DenseCausalAttention(1, s, windows=(w, None)).forward(0, q, k, v)
    torch.testing.assert_close(out, naive_attention(q, k, v, 0, w).float(), atol=2e-5, rtol=1e-4)
    out = DenseCausalAttention(1, s, windows=(w, None)).forward(1, q, k, v)
    torch.testing.assert_close(out, naive_attention(q, k, v, 0).float(), atol=2e-5, rtol=1e-4)
