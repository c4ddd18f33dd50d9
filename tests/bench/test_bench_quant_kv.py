"""bench_quant's dense stand-in for an int8 KV cache (``QuantizedKVDense``, used for perplexity and the probe)
computes what the paged int8 cache does: a prefill through the torch backend over an int8 KVCache gives the
same logits; and rounding K/V does change them (the stand-in is not the exact model)."""
from __future__ import annotations

import torch

from backend.attention.metadata import build_attention_metadata
from backend.attention.torch_paged import TorchPagedAttention
from backend.core.kv_cache import KVCache
from backend.model.loader import load_model
from bench.bench_quant import dense_attention


@torch.inference_mode()
def test_dense_stand_in_matches_the_paged_int8_cache(demo_target):
    model = load_model(demo_target)
    cfg = model.config
    ids = torch.tensor([0] + list(range(100, 149)))
    n = ids.numel()
    logits = {}
    for kv in ("auto", "int8"):
        logits[kv] = model.compute_logits(model(ids, torch.arange(n), dense_attention(kv)(n)))
    cache = KVCache(cfg.num_hidden_layers, 8, 16, cfg.num_key_value_heads, cfg.head_dim, kv_cache_dtype="int8")
    attn = TorchPagedAttention(cache)
    md = build_attention_metadata([0], [n], [[5, 2, 7, 1]], 16)
    attn.prepare(md)
    paged = model.compute_logits(model(ids, md.positions, attn))
    torch.testing.assert_close(paged, logits["int8"], atol=1e-4, rtol=1e-4)
    assert (logits["int8"] - logits["auto"]).abs().max() > 1e-4
