"""bench/bench_formats.py's arithmetic: the weight bytes a batch-1 step reads, and the cells of its table (medians
over the rounds, ratios, the bandwidth fraction at batch 1, prompt throughput at the largest batch), with fake runs."""
from __future__ import annotations

import pytest

from backend.model.config import ModelConfig
from bench.bench_formats import MODELS, cell_rows, print_rows, weight_bytes

CFG = ModelConfig.from_dict({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 4096, "hidden_size": 1024,
    "intermediate_size": 2816, "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 4,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "torch_dtype": "float32"})


def test_the_300m_shape_is_the_issues():
    assert MODELS["300m"] == dict(hidden=1024, intermediate=2816, layers=24, heads=16, kv_heads=4)


def test_weight_bytes_per_format():
    proj = 24 * (1024 * 1536 + 1024 * 1024 + 3 * 1024 * 2816)
    head = 4096 * 1024
    assert weight_bytes(CFG, "none", 128) == 4 * (proj + head)                       # about 1.1 GB
    assert weight_bytes(CFG, "int8", 128) == pytest.approx(proj * (1 + 4 / 1024) + head + 4 * 4096)
    assert weight_bytes(CFG, "int4", 128) == pytest.approx(proj * (0.5 + 8 / 128) + head + 4 * 4096)


def test_cells_are_medians_over_the_rounds(capsys):
    rounds = [{"ours": {1: (30.0, 200.0), 32: (300.0, 400.0)}, "llamacpp": {1: (20.0, 100.0), 32: (100.0, 300.0)}},
              {"ours": {1: (10.0, 100.0), 32: (100.0, 200.0)}, "llamacpp": {1: (20.0, 100.0), 32: (100.0, 100.0)}},
              {"ours": {1: (20.0, 150.0), 32: (200.0, 300.0)}, "llamacpp": {1: (20.0, 100.0), 32: (100.0, 200.0)}}]
    rows = cell_rows("300m", CFG, 128, {1: 1e10}, {("int8", "q8_0", 1): rounds})
    b1, b32 = rows
    assert (b1["batch"], b1["ours_tok_s"], b1["llamacpp_tok_s"], b1["ratio"]) == (1, 20.0, 20.0, 1.0)
    assert b1["rounds"] == [1.5, 0.5, 1.0]
    assert b1["bandwidth_fraction"] == pytest.approx(20.0 * weight_bytes(CFG, "int8", 128) / 1e10)
    assert "prompt_ratio" not in b1 and "bandwidth_fraction" not in b32
    assert (b32["ours_prompt_tok_s"], b32["llamacpp_prompt_tok_s"], b32["prompt_ratio"]) == (300.0, 200.0, 1.5)
    print_rows(rows)
    out = capsys.readouterr().out
    assert "geometric mean of the decode ratios 1.41" in out and "lowest 1.00" in out
