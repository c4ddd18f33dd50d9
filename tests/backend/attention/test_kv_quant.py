"""The quantized KV cache (``kv_cache_dtype`` int8): the maths, the torch backend against exact KV, capacity."""
import zlib
from pathlib import Path

import pytest
import torch

from backend.attention.metadata import build_attention_metadata
from backend.attention.torch_paged import TorchPagedAttention
from backend.core.kv_cache import KVCache, kv_bytes_per_block, num_blocks_for_budget
from backend.core.kv_quant import (
    FP8_MAX,
    INT8_MAX,
    MIN_SCALE,
    check_kv_format_device,
    dequantize_into,
    kv_format,
    quantize_per_token_head,
)
from tests.helpers.isolated import assert_interpreted_cases_pass, run_isolated
from tests.helpers.paged_reference import make_case

CASES = {
    "decode_batch": ([0, 15, 16, 17, 40], [1, 1, 1, 1, 1]),
    "prefill_one": ([0], [23]),
    "prefix_hit_chunk": ([32], [7]),
    "mixed": ([20, 0, 5, 33], [1, 9, 4, 1]),
    "verify_drafts": ([11, 29], [4, 4]),
}


def test_int8_round_trip_error_is_half_a_step():
    x = torch.randn(50, 3, 32) * torch.logspace(-3, 2, 50)[:, None, None]   # tokens of very different magnitude
    x[7, 1] = 0.0                                                             # an all-zero head
    fmt = kv_format("int8", torch.float32)
    q, scale = quantize_per_token_head(x, fmt)
    assert q.dtype == torch.int8 and scale.dtype == torch.float16 and scale.shape == (50, 3)
    assert int(q.abs().max()) <= INT8_MAX and float(scale.min()) >= MIN_SCALE
    back = dequantize_into(torch.empty_like(x), q, scale)
    step = scale.float().unsqueeze(-1)
    assert bool(((back - x).abs() <= step * 0.5 + 1e-6 * x.abs()).all())
    # the scale uses the range: the largest code of every non-zero head is close to 127
    assert int(q.abs().amax(-1)[x.abs().amax(-1) > 1e-2].min()) >= 126
    assert torch.equal(back[7, 1], torch.zeros(32))


def test_fp8_round_trip_relative_error():
    x = torch.randn(20, 2, 32)
    fmt = kv_format("fp8", torch.float32)
    q, scale = quantize_per_token_head(x, fmt)
    assert q.dtype == torch.float8_e4m3fn and float(q.float().abs().max()) <= FP8_MAX
    back = dequantize_into(torch.empty_like(x), q, scale)
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normal values
    big = x.abs() > x.abs().amax(-1, keepdim=True) / 64
    assert bool(((back - x).abs()[big] <= x.abs()[big] / 16 + 1e-6).all())


def quantized_cache(case, num_kv_heads, head_dim, block_size, layer=1):
    cache = KVCache(num_layers=2, num_blocks=case["num_blocks"], block_size=block_size, num_kv_heads=num_kv_heads,
                    head_dim=head_dim, kv_cache_dtype="int8")
    for data, scales, full in ((cache.k, cache.k_scale, case["k_cache"]), (cache.v, cache.v_scale, case["v_cache"])):
        q, s = quantize_per_token_head(full.view(-1, num_kv_heads, head_dim), cache.format)
        data[layer].view(-1, num_kv_heads, head_dim).copy_(q)
        scales[layer].view(-1, num_kv_heads).copy_(s)
    return cache


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("block_size", [4, 16])
def test_int8_attention_close_to_exact(name, heads, kv_heads, block_size):
    """Attention over int8 K/V (per token and head scales) stays within 2% of the K/V range of exact attention."""
    ctx, ql = CASES[name]
    case = make_case(ctx, ql, num_heads=heads, num_kv_heads=kv_heads, head_dim=32, block_size=block_size,
                     seed=zlib.crc32(f"{name}{heads}{block_size}".encode()))
    cache = quantized_cache(case, kv_heads, 32, block_size)
    attn = TorchPagedAttention(cache)
    attn.prepare(case["md"])
    out = attn.forward(1, case["q"], case["k"], case["v"])
    assert out.dtype == torch.float32 and out.shape == case["q"].shape
    err = (out - case["expected"]).abs().max()
    assert 0 < err < 0.03, err      # values ~N(0, 1): a half step is ~0.01; 0 would mean nothing was quantized
    # the new tokens' K/V landed in their slots as codes + scales
    slots = case["md"].slot_mapping
    q, s = quantize_per_token_head(case["k"], cache.format)
    assert torch.equal(cache.k[1].view(-1, kv_heads, 32)[slots], q)
    assert torch.equal(cache.k_scale[1].view(-1, kv_heads)[slots], s)


def test_int8_decode_steps_reuse_the_cache_after_block_copy():
    """Prefill, copy-on-write of the last block, then decodes of both copies see the same K/V (scales moved)."""
    torch.manual_seed(0)
    kvh, d, bs = 2, 32, 4
    cache = KVCache(1, 8, bs, kvh, d, kv_cache_dtype="int8")
    ref = KVCache(1, 8, bs, kvh, d)
    k, v, q = torch.randn(7, kvh, d), torch.randn(7, kvh, d), torch.randn(7, 4, d)
    outs = {}
    for name, c in (("int8", cache), ("fp32", ref)):
        attn = TorchPagedAttention(c)
        attn.prepare(build_attention_metadata([0], [6], [[2, 5]], bs))
        attn.forward(0, q[:6], k[:6], v[:6])
        c.copy_blocks([(5, 6)])                                        # a fork's copy of the partial block
        attn.prepare(build_attention_metadata([6, 6], [1, 1], [[2, 5], [2, 6]], bs))
        outs[name] = attn.forward(0, q[6:].expand(2, 4, d), k[6:].expand(2, kvh, d), v[6:].expand(2, kvh, d))
    assert torch.equal(cache.k_scale[0][6, :2], cache.k_scale[0][5, :2])
    torch.testing.assert_close(outs["int8"][0], outs["int8"][1])        # both copies hold the same K/V
    assert (outs["int8"] - outs["fp32"]).abs().max() < 0.03


def test_capacity_int8_against_fp32_on_the_demo_shape():
    """Demo target: 4 layers, 2 KV heads, head_dim 32: int8 + fp16 scales hold >= 3.5x the blocks of fp32."""
    budget = 64 << 20
    shape = {"num_layers": 4, "block_size": 16, "num_kv_heads": 2, "head_dim": 32, "dtype": torch.float32}
    fp32 = num_blocks_for_budget(budget, **shape)
    int8 = num_blocks_for_budget(budget, **shape, kv_cache_dtype="int8")
    assert int8 / fp32 >= 3.5
    assert kv_bytes_per_block(**shape, kv_cache_dtype="int8") == 2 * 4 * 16 * 2 * (32 + 2)
    assert kv_bytes_per_block(**shape, kv_cache_dtype="fp8") == kv_bytes_per_block(**shape, kv_cache_dtype="int8")
    bf16 = num_blocks_for_budget(budget, **{**shape, "dtype": torch.bfloat16})
    assert num_blocks_for_budget(budget, **{**shape, "dtype": torch.bfloat16}, kv_cache_dtype="int8") / bf16 >= 1.85
    c = KVCache.from_budget(budget, **shape, kv_cache_dtype="int8")
    assert c.num_blocks == int8 and c.nbytes <= budget
    assert c.nbytes == int8 * kv_bytes_per_block(**shape, kv_cache_dtype="int8")   # the scales are counted


def test_copy_blocks_moves_scales_in_every_layer():
    c = KVCache(num_layers=2, num_blocks=4, block_size=2, num_kv_heads=1, head_dim=3, kv_cache_dtype="int8")
    c.data.copy_(torch.randint(-127, 128, c.data.shape, dtype=torch.int8))
    c.scales.copy_(torch.rand(c.scales.shape))
    before_scales = c.scales.clone()
    c.copy_blocks([(1, 3)])
    for layer in range(2):
        assert torch.equal(c.k_scale[layer][3], before_scales[0, layer, 1])
        assert torch.equal(c.v_scale[layer][3], before_scales[1, layer, 1])
        assert torch.equal(c.k[layer][3], c.k[layer][1])


def test_bad_kv_cache_dtype_names_the_parameter():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_format("int4", torch.float32)
    with pytest.raises(ValueError, match="kv_cache_dtype: fp8 needs a CUDA device"):
        KVCache(1, 2, 16, 1, 32, kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        check_kv_format_device(kv_format("fp8", torch.float32), "cpu")
    check_kv_format_device(kv_format("int8", torch.float32), "cpu")
    assert kv_format("auto", torch.bfloat16).label == "bfloat16" and kv_format("int8", torch.float32).label == "int8"


def test_kernels_over_quantized_cache_under_interpreter():
    """triton_interpret_kv_quant_cases.py: write kernel codes/scales, decode (split-K) and prefill (windowed)
    over int8 and fp8 caches in fp32 and fp16, the Triton backend's steps against the torch backend's."""
    assert_interpreted_cases_pass(Path(__file__).resolve().parent / "triton_interpret_kv_quant_cases.py", timeout=600)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (compiled kernels)")
def test_compiled_kernels_over_quantized_cache_on_gpu():
    res = run_isolated([str(Path(__file__).resolve().parent / "gpu_kv_quant_check.py")], {}, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr


def test_fp8_torch_path_and_block_copy(monkeypatch):
    """The torch backend's fp8 write/read and fp8 block copies (served on CUDA; computed here with the CPU
    refusal lifted): float8 is moved as bytes, attention stays near exact KV."""
    import backend.core.kv_cache as kv_cache_module
    monkeypatch.setattr(kv_cache_module, "check_kv_format_device", lambda fmt, device: None)
    torch.manual_seed(0)
    caches = {"fp8": KVCache(1, 8, 4, 2, 32, kv_cache_dtype="fp8"), "exact": KVCache(1, 8, 4, 2, 32)}
    q, k, v = torch.randn(6, 4, 32), torch.randn(6, 2, 32), torch.randn(6, 2, 32)
    outs = {}
    for name, cache in caches.items():
        attn = TorchPagedAttention(cache)
        attn.prepare(build_attention_metadata([0], [6], [[2, 5]], 4))
        outs[name] = attn.forward(0, q, k, v)
    assert 0 < (outs["fp8"] - outs["exact"]).abs().max() < 0.2      # e4m3: 3 mantissa bits
    c = caches["fp8"]
    assert c.k[0].dtype == torch.float8_e4m3fn
    c.copy_blocks([(5, 6)])
    assert torch.equal(c.k[0][6].view(torch.uint8), c.k[0][5].view(torch.uint8))
    assert torch.equal(c.v_scale[0][6], c.v_scale[0][5])
