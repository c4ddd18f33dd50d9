"""The Triton kernels over a quantized KV cache (int8, fp8) under the interpreter, against the torch path.

Run by ``test_kv_quant.py`` in a fresh process with ``TRITON_INTERPRET=1`` (see test_triton_kernels.py).
The write kernel must produce the codes and scales of ``quantize_per_token_head``; the attention
kernels must equal the torch backend over the dequantized cache.

The interpreter converts fp32 to float8 wrongly when rounding carries into the exponent (127.2 becomes 64,
not 128: it keeps the exponent and drops the carry), so under it the fp8 cases write the new tokens with the
torch quantizer and test the kernels' fp8 reads; the fp8 write kernel is checked compiled, on CUDA
(gpu_kv_quant_check.py).
"""
import os

if os.environ.get("TRITON_INTERPRET") != "1":
    raise RuntimeError("run with TRITON_INTERPRET=1 (see test_kv_quant.py)")

import pytest
import torch

from backend.attention.kernels.paged_decode import paged_decode_attention
from backend.attention.kernels.paged_prefill import paged_prefill_attention
from backend.attention.kernels.reshape_and_cache import reshape_and_cache
from backend.attention.metadata import build_attention_metadata
from backend.attention.torch_paged import TorchPagedAttention
from backend.attention.triton_paged import TritonPagedAttention
from backend.core.kv_cache import KVCache
from backend.core.kv_quant import dequantize_into, kv_format, quantize_per_token_head
from tests.helpers.paged_reference import make_case

STORAGE = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-4}, torch.float16: {"atol": 3e-3, "rtol": 3e-3}}


def quantized_case(ctx, qlens, kv, dtype, heads, kvh, d, bs, seed, window=None):
    """make_case with its cached prefixes quantized into ``kv`` codes + fp16 scales."""
    case = make_case(ctx, qlens, num_heads=heads, num_kv_heads=kvh, head_dim=d, block_size=bs, dtype=dtype,
                     seed=seed, window=window)
    fmt = kv_format(kv, dtype)
    for name in ("k", "v"):
        codes, scales = quantize_per_token_head(case[f"{name}_cache"].view(-1, kvh, d), fmt)
        case[f"{name}_cache"] = codes.view(-1, bs, kvh, d)
        case[f"{name}_scale"] = scales.view(-1, bs, kvh)
    return case, fmt


def write_and_reference(case, fmt, kvh, d, bs, window=None):
    """Write the new tokens with the kernel (checked against the torch quantizer), then the torch backend's
    output over the dequantized cache (the reference the attention kernels must reproduce)."""
    md = case["md"]
    if fmt.name == "int8":
        reshape_and_cache(case["k"], case["v"], case["k_cache"], case["v_cache"], md.slot_mapping,
                          case["k_scale"], case["v_scale"])
    deq = {}
    for name in ("k", "v"):
        codes, scales = quantize_per_token_head(case[name], fmt)
        if fmt.name == "fp8":   # the interpreter's float8 conversion is wrong (module docstring)
            case[f"{name}_cache"].view(-1, kvh, d)[md.slot_mapping] = codes
            case[f"{name}_scale"].view(-1, kvh)[md.slot_mapping] = scales
        assert torch.equal(case[f"{name}_cache"].view(-1, kvh, d)[md.slot_mapping].float(), codes.float())
        assert torch.equal(case[f"{name}_scale"].view(-1, kvh)[md.slot_mapping], scales)
        deq[name] = dequantize_into(torch.empty(case[f"{name}_cache"].shape), case[f"{name}_cache"],
                                    case[f"{name}_scale"])
    cache = KVCache(1, case["num_blocks"], bs, kvh, d)
    cache.k[0].copy_(deq["k"])
    cache.v[0].copy_(deq["v"])
    ref = TorchPagedAttention(cache, windows=(window,))
    ref.prepare(md)
    slots = md.slot_mapping
    return ref.forward(0, case["q"].float(), deq["k"].view(-1, kvh, d)[slots], deq["v"].view(-1, kvh, d)[slots])


@pytest.mark.parametrize("kv", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group,bs,bpp", [(1, 16, None), (4, 16, 1), (4, 32, 2)])
def test_decode_over_quantized_cache(kv, dtype, group, bs, bpp):
    heads, kvh = (2, 2) if group == 1 else (4, 1)
    case, fmt = quantized_case([0, 20, 70], [1, 1, 1], kv, dtype, heads, kvh, 32, bs, seed=group)
    ref = write_and_reference(case, fmt, kvh, 32, bs)
    md = case["md"]
    out = paged_decode_attention(case["q"], case["k_cache"], case["v_cache"], md.block_tables, md.seq_lens,
                                 md.max_seq_len, blocks_per_partition=bpp, k_scale=case["k_scale"],
                                 v_scale=case["v_scale"])
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])
    assert (out.float() - case["expected"]).abs().max() < (0.03 if kv == "int8" else 0.15)   # near exact KV


@pytest.mark.parametrize("kv", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("window", [None, 7])
def test_prefill_over_quantized_cache(kv, dtype, window):
    case, fmt = quantized_case([9, 0, 35, 18], [1, 21, 5, 4], kv, dtype, 4, 2, 32, 16, seed=5, window=window)
    ref = write_and_reference(case, fmt, 2, 32, 16, window)
    md = case["md"]
    out = paged_prefill_attention(case["q"], case["k_cache"], case["v_cache"], md.block_tables, md.seq_lens,
                                  md.query_start_loc, md.max_query_len, block_m=16, window=window,
                                  k_scale=case["k_scale"], v_scale=case["v_scale"])
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])


def test_backend_steps_int8_match_torch():
    """Prefill, split-K decode and a mixed step through both backends over int8 caches: same outputs,
    the same codes and scales in the cache."""
    torch.manual_seed(0)
    heads, kvh, d, bs = 4, 2, 32, 16
    caches = [KVCache(2, 8, bs, kvh, d, kv_cache_dtype="int8") for _ in range(2)]
    ref = TorchPagedAttention(caches[0])
    tri = TritonPagedAttention(caches[1], partition_tokens=16, split_k=True, prefill_block_m=16)
    tables = [[3, 0, 5], [6, 1]]
    for computed, new in [([0, 0], [19, 2]), ([19, 2], [1, 1]), ([20, 3], [1, 3])]:
        md = build_attention_metadata(computed, new, tables, bs)
        t = sum(new)
        q, k, v = torch.randn(t, heads, d), torch.randn(t, kvh, d), torch.randn(t, kvh, d)
        outs = []
        for attn in (ref, tri):
            attn.prepare(md)
            outs.append(attn.forward(1, q, k, v))
        torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-4)
    assert torch.equal(caches[0].data, caches[1].data) and torch.equal(caches[0].scales, caches[1].scales)


def test_scales_are_checked():
    kc = torch.zeros(2, 16, 1, 32, dtype=torch.int8)
    q = torch.zeros(1, 1, 32)
    args = (torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), 1)
    with pytest.raises(ValueError, match="needs k_scale and v_scale"):
        paged_decode_attention(q, kc, kc.clone(), *args)
    with pytest.raises(ValueError, match="takes no scales"):
        s = torch.ones(2, 16, 1, dtype=torch.float16)
        paged_decode_attention(q, kc.float(), kc.float(), *args, k_scale=s, v_scale=s)
