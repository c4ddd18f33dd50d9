"""Triton attention kernels under the interpreter (CPU), against the torch paged backend.

Run by ``test_triton_kernels.py`` in a fresh process with ``TRITON_INTERPRET=1``: triton
reads the variable when ``@triton.jit`` decorates a function, its own library included
(``triton.language.standard``), so it must be set before triton is first imported, and a
process cannot mix interpreted and compiled kernels. Run alone with
``TRITON_INTERPRET=1 python -m pytest tests/triton_interpret_cases.py``.
Shapes are small: the interpreter runs every program in Python.
"""
import os

if os.environ.get("TRITON_INTERPRET") != "1":
    raise RuntimeError("run with TRITON_INTERPRET=1 (see test_triton_kernels.py)")

import pytest  # noqa: E402
import torch  # noqa: E402

from backend.attention.kernels.paged_decode import paged_decode_attention  # noqa: E402
from backend.attention.kernels.paged_prefill import paged_prefill_attention, query_block  # noqa: E402
from backend.attention.kernels.reshape_and_cache import reshape_and_cache  # noqa: E402
from backend.attention.metadata import build_attention_metadata  # noqa: E402
from backend.attention.selector import make_attention_backend  # noqa: E402
from backend.attention.torch_paged import TorchPagedAttention  # noqa: E402
from backend.attention.triton_paged import TritonPagedAttention, use_split_k  # noqa: E402
from backend.core.kv_cache import KVCache  # noqa: E402
from tests.helpers.paged_reference import make_case  # noqa: E402

GQA = {1: (2, 2), 4: (4, 1), 8: (8, 1)}  # group -> (num_heads, num_kv_heads)
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.float16: dict(atol=3e-3, rtol=3e-3)}


def test_kernels_are_interpreted():
    from backend.attention.kernels import paged_decode
    assert type(paged_decode._decode_kernel).__name__ == "InterpretedFunction"


def torch_reference(case, num_kv_heads, head_dim, block_size, window=None):
    """The torch backend on the same (dtype-rounded) inputs, computed in fp32."""
    cache = KVCache(1, case["num_blocks"], block_size, num_kv_heads, head_dim)
    cache.k[0].copy_(case["k_cache"].float())
    cache.v[0].copy_(case["v_cache"].float())
    attn = TorchPagedAttention(cache, windows=(window,))
    attn.prepare(case["md"])
    return attn.forward(0, case["q"].float(), case["k"].float(), case["v"].float())


def test_reshape_and_cache_fp16_strided_and_skip():
    kvh, d, bs = 2, 8, 16
    kc = torch.zeros(4, bs, kvh, d, dtype=torch.float16)
    vc = torch.zeros_like(kc)
    packed = torch.randn(3, 3 * kvh * d).half()                     # like a fused qkv output
    k = packed[:, :kvh * d].view(3, kvh, d)
    v = packed[:, 2 * kvh * d:].view(3, kvh, d)                      # token stride 3*kvh*d
    slots = torch.tensor([5, 2 * bs + 15, -1])
    reshape_and_cache(k, v, kc, vc, slots)
    assert torch.equal(kc.view(-1, kvh, d)[5], k[0]) and torch.equal(vc.view(-1, kvh, d)[47], v[1])
    assert int((kc != 0).any(-1).any(-1).sum()) == 2                # the -1 slot wrote nothing


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size,bpp", [(16, 1), (32, None), (32, 2)])
def test_decode_matches_torch(group, dtype, block_size, bpp):
    heads, kvh = GQA[group]
    ctx = [0, 20, 70] if block_size == 16 else [33, 5, 100]         # lengths off the block grid
    case = make_case(ctx, [1] * len(ctx), num_heads=heads, num_kv_heads=kvh, head_dim=32,
                     block_size=block_size, dtype=dtype, seed=group)
    md = case["md"]
    reshape_and_cache(case["k"], case["v"], case["k_cache"], case["v_cache"], md.slot_mapping)
    out = paged_decode_attention(case["q"], case["k_cache"], case["v_cache"], md.block_tables, md.seq_lens,
                                 md.max_seq_len, blocks_per_partition=bpp)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), torch_reference(case, kvh, 32, block_size), **TOL[dtype])


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [16, 32])
def test_prefill_matches_torch(group, dtype, block_size):
    heads, kvh = GQA[group]
    head_dim = 24 if (group, dtype) == (4, torch.float32) else 32  # one padded head_dim
    # decode, prefill from scratch, prefix hit + chunk, draft verification
    case = make_case([9, 0, 35, 18], [1, 21, 5, 4], num_heads=heads, num_kv_heads=kvh, head_dim=head_dim,
                     block_size=block_size, dtype=dtype, seed=10 + group)
    md = case["md"]
    reshape_and_cache(case["k"], case["v"], case["k_cache"], case["v_cache"], md.slot_mapping)
    out = paged_prefill_attention(case["q"], case["k_cache"], case["v_cache"], md.block_tables, md.seq_lens,
                                  md.query_start_loc, md.max_query_len, block_m=16)
    torch.testing.assert_close(out.float(), torch_reference(case, kvh, head_dim, block_size), **TOL[dtype])


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bpp,window", [(1, 20), (None, 20), (2, 40), (1, 1)])
def test_decode_window_matches_torch(group, dtype, bpp, window):
    """Sliding window in the decode kernel: partitions wholly before the window skipped (and ignored by
    the reduce); the partition holding the window's first key starts there."""
    heads, kvh = GQA[group]
    case = make_case([0, 20, 70, 45], [1] * 4, num_heads=heads, num_kv_heads=kvh, head_dim=32, block_size=16,
                     dtype=dtype, seed=30 + group, window=window)
    md = case["md"]
    reshape_and_cache(case["k"], case["v"], case["k_cache"], case["v_cache"], md.slot_mapping)
    out = paged_decode_attention(case["q"], case["k_cache"], case["v_cache"], md.block_tables, md.seq_lens,
                                 md.max_seq_len, blocks_per_partition=bpp, window=window)
    torch.testing.assert_close(out.float(), torch_reference(case, kvh, 32, 16, window), **TOL[dtype])
    torch.testing.assert_close(out.float(), case["expected"], **TOL[dtype])


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("window,block_m", [(7, 16), (20, 32), (1, 16)])
def test_prefill_window_matches_torch(group, dtype, window, block_m):
    """Sliding window in the multi-query kernel: rows of one program whose windows start in different
    blocks (a row that has seen no key yet contributes nothing, never NaN)."""
    heads, kvh = GQA[group]
    case = make_case([9, 0, 35, 18], [1, 40, 5, 4], num_heads=heads, num_kv_heads=kvh, head_dim=32,
                     block_size=16, dtype=dtype, seed=40 + group, window=window)
    md = case["md"]
    reshape_and_cache(case["k"], case["v"], case["k_cache"], case["v_cache"], md.slot_mapping)
    out = paged_prefill_attention(case["q"], case["k_cache"], case["v_cache"], md.block_tables, md.seq_lens,
                                  md.query_start_loc, md.max_query_len, block_m=block_m, window=window)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), torch_reference(case, kvh, 32, 16, window), **TOL[dtype])
    torch.testing.assert_close(out.float(), case["expected"], **TOL[dtype])


def test_backend_window_steps_with_freed_blocks():
    """Per-layer windows through both backends: a prefill, then decodes whose early blocks were freed
    (NULL_BLOCK in the table, junk in the old block): same outputs as the torch backend."""
    from backend.core.block_manager import NULL_BLOCK
    torch.manual_seed(1)
    heads, kvh, d, bs, window = 4, 2, 16, 16, 18
    caches = [KVCache(2, 10, bs, kvh, d) for _ in range(2)]
    ref = TorchPagedAttention(caches[0], windows=(window, None))
    tri = TritonPagedAttention(caches[1], partition_tokens=16, split_k=True, prefill_block_m=16,
                               windows=(window, None))
    tables = [[3, 0, 5, 7], [6, 1]]
    steps = [([0, 0], [40, 2]), ([40, 2], [1, 1]), ([41, 3], [3, 1])]  # prefill, decode (split-K), verify + decode
    for n, (computed, new) in enumerate(steps):
        if n == 1:   # the windowed layers no longer read block 3 (positions 0-15) of sequence 0
            for c in caches:
                c.k[0][3] = 1e4
                c.v[0][3] = -1e4
            tables[0][0] = NULL_BLOCK
        md = build_attention_metadata(computed, new, tables, bs)
        t = sum(new)
        q, k, v = torch.randn(t, heads, d), torch.randn(t, kvh, d), torch.randn(t, kvh, d)
        for attn in (ref, tri):
            attn.prepare(md)
        torch.testing.assert_close(tri.forward(0, q, k, v), ref.forward(0, q, k, v), atol=1e-5, rtol=1e-4)
        if n == 0:   # the unwindowed layer still reads everything (no block of it is freed)
            torch.testing.assert_close(tri.forward(1, q, k, v), ref.forward(1, q, k, v), atol=1e-5, rtol=1e-4)


def two_backends(num_blocks, block_size, kvh, d, **triton_kw):
    caches = [KVCache(2, num_blocks, block_size, kvh, d) for _ in range(2)]
    return caches, TorchPagedAttention(caches[0]), TritonPagedAttention(caches[1], **triton_kw)


def test_backend_steps_match_torch():
    """Prefill chunk + decode steps through both backends on layer 1: same outputs, same cache."""
    torch.manual_seed(0)
    heads, kvh, d, bs = 4, 1, 16, 16
    caches, ref, tri = two_backends(8, bs, kvh, d, partition_tokens=16, split_k=True, prefill_block_m=16)
    tables = [[3, 0, 5], [6, 1]]
    steps = [([0, 0], [19, 2]), ([19, 2], [1, 1]), ([20, 3], [1, 3])]  # prefill, decode (split-K), mixed
    for computed, new in steps:
        md = build_attention_metadata(computed, new, tables, bs)
        t = sum(new)
        q, k, v = torch.randn(t, heads, d), torch.randn(t, kvh, d), torch.randn(t, kvh, d)
        outs = []
        for attn in (ref, tri):
            attn.prepare(md)
            outs.append(attn.forward(1, q, k, v))
        torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-4)
    assert torch.equal(caches[0].data, caches[1].data)


def test_split_k_heuristic_and_launch_shapes():
    assert not use_split_k(num_seqs=4, num_kv_heads=2, parts=1, max_seq_len=300, target_programs=256)
    assert use_split_k(num_seqs=4, num_kv_heads=2, parts=3, max_seq_len=1500, target_programs=256)
    assert not use_split_k(num_seqs=256, num_kv_heads=8, parts=3, max_seq_len=1500, target_programs=256)
    assert use_split_k(num_seqs=256, num_kv_heads=8, parts=20, max_seq_len=10000, target_programs=256)
    assert query_block(group=1, block_m=64) == (64, 1)
    assert query_block(group=6, block_m=64) == (8, 8)
    assert query_block(group=8, block_m=8) == (2, 8)                 # BLOCK_M never below 16


def test_selector():
    cache = KVCache(1, 2, 16, 1, 16)
    assert isinstance(make_attention_backend(cache), TorchPagedAttention)
    assert isinstance(make_attention_backend(cache, kind="triton"), TritonPagedAttention)
    with pytest.raises(ValueError):
        make_attention_backend(cache, kind="flash")
    with pytest.raises(ValueError, match="block_size"):
        TritonPagedAttention(KVCache(1, 2, 8, 1, 16))
    with pytest.raises(ValueError, match="block_size"):
        paged_decode_attention(torch.zeros(1, 1, 16), torch.zeros(2, 8, 1, 16), torch.zeros(2, 8, 1, 16),
                               torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), 1)
