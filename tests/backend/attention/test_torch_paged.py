"""The torch paged backend against naive dense attention per sequence (fp32)."""
import zlib

import pytest
import torch

from backend.attention.metadata import build_attention_metadata
from backend.attention.torch_paged import TorchPagedAttention
from backend.core.kv_cache import KVCache
from tests.helpers.paged_reference import make_case

CASES = {
    # name: (ctx_lens, query_lens)
    "decode_one": ([37], [1]),
    "decode_batch": ([0, 15, 16, 17, 40], [1, 1, 1, 1, 1]),
    "prefill_one": ([0], [23]),
    "prefix_hit_chunk": ([32], [7]),
    "mixed": ([20, 0, 5, 33], [1, 9, 4, 1]),
    "verify_drafts": ([11, 29], [4, 4]),
}


def run_backend(case, num_kv_heads, head_dim, block_size, layer=1):
    cache = KVCache(num_layers=2, num_blocks=case["num_blocks"], block_size=block_size,
                    num_kv_heads=num_kv_heads, head_dim=head_dim)
    cache.k[layer].copy_(case["k_cache"])
    cache.v[layer].copy_(case["v_cache"])
    attn = TorchPagedAttention(cache)
    attn.prepare(case["md"])
    return attn.forward(layer, case["q"], case["k"], case["v"]), cache


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (8, 1)])
@pytest.mark.parametrize("block_size", [4, 16])
def test_matches_naive(name, heads, kv_heads, block_size):
    ctx, ql = CASES[name]
    case = make_case(ctx, ql, num_heads=heads, num_kv_heads=kv_heads, head_dim=16, block_size=block_size,
                     seed=zlib.crc32(f"{name}{heads}{block_size}".encode()))
    out, _ = run_backend(case, kv_heads, 16, block_size)
    assert out.shape == case["q"].shape
    torch.testing.assert_close(out, case["expected"], atol=2e-5, rtol=1e-4)


def test_new_kv_written_to_slots():
    case = make_case([5, 0], [2, 3], num_heads=4, num_kv_heads=2, head_dim=8, block_size=4)
    _, cache = run_backend(case, 2, 8, 4)
    slots = case["md"].slot_mapping
    flat_k = cache.k[1].reshape(-1, 2, 8)
    assert torch.equal(flat_k[slots], case["k"])
    assert torch.equal(cache.v[1].reshape(-1, 2, 8)[slots], case["v"])
    assert cache.k[0].abs().sum() == 0  # other layers untouched


def test_steps_reuse_the_cache():
    """Prefill, then two decode steps: the decodes see the K/V the prefill wrote."""
    torch.manual_seed(0)
    h, kvh, d, bs, n = 4, 2, 8, 4, 9
    k = torch.randn(n + 2, kvh, d)
    v = torch.randn(n + 2, kvh, d)
    q = torch.randn(n + 2, h, d)
    cache = KVCache(1, 8, bs, kvh, d)
    attn = TorchPagedAttention(cache)
    table = [6, 1, 3]
    attn.prepare(build_attention_metadata([0], [n], [table], bs))
    outs = [attn.forward(0, q[:n], k[:n], v[:n])]
    for p in (n, n + 1):
        attn.prepare(build_attention_metadata([p], [1], [table], bs))
        outs.append(attn.forward(0, q[p:p + 1], k[p:p + 1], v[p:p + 1]))
    from tests.helpers.paged_reference import naive_attention
    torch.testing.assert_close(torch.cat(outs), naive_attention(q, k, v, 0).float(), atol=2e-5, rtol=1e-4)


def test_garbage_in_unused_slots_is_ignored():
    case = make_case([6, 13], [1, 1], num_heads=4, num_kv_heads=2, head_dim=8, block_size=4, extra_blocks=2)
    used = {b for t in case["tables"] for b in t}
    for b in range(case["num_blocks"]):  # large (finite) junk in unused blocks and past each length
        if b not in used:
            case["k_cache"][b] = 1e4
            case["v_cache"][b] = -1e4
    out, _ = run_backend(case, 2, 8, 4)
    torch.testing.assert_close(out, case["expected"], atol=2e-5, rtol=1e-4)


def test_forward_before_prepare_raises():
    attn = TorchPagedAttention(KVCache(1, 2, 4, 1, 8))
    with pytest.raises(RuntimeError):
        attn.forward(0, torch.zeros(1, 1, 8), torch.zeros(1, 1, 8), torch.zeros(1, 1, 8))


def test_mixed_step_splits_decodes_from_prefills():
    from backend.attention.torch_paged import plan_paged_attention
    md = build_attention_metadata([20, 0, 5, 33, 7], [1, 9, 4, 1, 2], [[0, 1], [2], [3], [4, 5, 6], [7]], 16)
    plan = plan_paged_attention(md, 16)
    dec, pre = plan.groups
    assert (dec.num_seqs, dec.max_query_len, dec.ctx_len) == (2, 1, 34)
    assert dec.token_index.tolist() == [0, 14]
    assert (pre.num_seqs, pre.max_query_len, pre.ctx_len) == (3, 9, 9)
    assert pre.token_index.tolist() == list(range(1, 14)) + [15, 16]
    assert len(plan_paged_attention(build_attention_metadata([3, 4], [1, 1], [[0], [1]], 16), 16).groups) == 1


def test_functional_form_matches():
    from backend.attention.torch_paged import paged_attention, plan_paged_attention, write_kv
    case = make_case([20, 0, 5, 33], [1, 9, 4, 1], num_heads=8, num_kv_heads=2, head_dim=8, block_size=4)
    kc, vc = case["k_cache"], case["v_cache"]
    write_kv(kc.view(-1, 2, 8), case["k"], case["md"].slot_mapping)
    write_kv(vc.view(-1, 2, 8), case["v"], case["md"].slot_mapping)
    out = paged_attention(case["q"], kc, vc, plan_paged_attention(case["md"], 4))
    torch.testing.assert_close(out, case["expected"], atol=2e-5, rtol=1e-4)


def test_bfloat16_cache():
    case = make_case([20, 0, 33], [1, 9, 1], num_heads=8, num_kv_heads=2, head_dim=16, block_size=16,
                     dtype=torch.bfloat16)
    cache = KVCache(1, case["num_blocks"], 16, 2, 16, dtype=torch.bfloat16)
    cache.k[0].copy_(case["k_cache"])
    cache.v[0].copy_(case["v_cache"])
    attn = TorchPagedAttention(cache)
    attn.prepare(case["md"])
    out = attn.forward(0, case["q"], case["k"], case["v"])
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), case["expected"], atol=3e-2, rtol=3e-2)
