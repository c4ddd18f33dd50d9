"""EngineConfig: validation naming the field, and parsing of Triton string parameters."""
from __future__ import annotations

import pytest

from backend.config import EngineConfig


def test_defaults_and_resolved_max_model_len():
    c = EngineConfig(model_path="/m")
    assert (c.block_size, c.kv_cache_bytes, c.max_num_seqs, c.max_num_batched_tokens) == (16, None, 64, 1024)
    assert c.num_kv_blocks is None and c.enable_prefix_caching and not c.speculative
    assert c.resolve_max_model_len(4096) == 4096
    assert EngineConfig(model_path="/m", max_model_len=512).resolve_max_model_len(4096) == 512
    with pytest.raises(ValueError, match="max_model_len"):
        EngineConfig(model_path="/m", max_model_len=8192).resolve_max_model_len(4096)
    with pytest.raises(Exception):
        c.block_size = 32      # frozen


@pytest.mark.parametrize("kwargs, field", [
    (dict(model_path=""), "model_path"),
    (dict(block_size=12), "block_size"),
    (dict(block_size=0), "block_size"),
    (dict(num_kv_blocks=0), "num_kv_blocks"),
    (dict(kv_cache_bytes=0), "kv_cache_bytes"),
    (dict(gpu_memory_utilization=0.0), "gpu_memory_utilization"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(max_num_batched_tokens=True), "max_num_batched_tokens"),
    (dict(max_model_len=1), "max_model_len"),
    (dict(enable_prefix_caching="yes"), "enable_prefix_caching"),
    (dict(watermark=1.0), "watermark"),
    (dict(watermark=float("nan")), "watermark"),
    (dict(stream_interval=0), "stream_interval"),
    (dict(device="tpu"), "device"),
    (dict(dtype="int8"), "dtype"),
    (dict(num_speculative_tokens=-1), "num_speculative_tokens"),
    (dict(num_speculative_tokens=0), "num_speculative_tokens"),
    (dict(num_speculative_tokens=17), "num_speculative_tokens"),
    (dict(speculative_method="medusa", num_speculative_tokens=2), "speculative_method"),
    (dict(speculative_method=None), "speculative_method"),
    (dict(speculative_method="draft", num_speculative_tokens=2), "draft_model_path"),
    (dict(ngram_min=0), "ngram_min"),
    (dict(ngram_min=5, ngram_max=4), "ngram_min"),
    (dict(ngram_max=65), "ngram_max"),
    (dict(speculative_adaptive="yes"), "speculative_adaptive"),
    (dict(seed=-1), "seed"),
])
def test_invalid_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        EngineConfig(**{"model_path": "/m", **kwargs})


def test_valid_variants():
    EngineConfig(model_path="/m", device="cuda:1", dtype="bfloat16", watermark=0.0, num_kv_blocks=100)
    c = EngineConfig(model_path="/m", draft_model_path="/d", speculative_method="draft", num_speculative_tokens=4)
    assert c.speculative
    assert not EngineConfig(model_path="/m", num_speculative_tokens=7).speculative   # k without a method: off


def test_from_parameters_parses_strings_and_triton_dicts():
    c = EngineConfig.from_parameters({
        "model_path": {"string_value": "/models/target"}, "block_size": "32", "num_kv_blocks": "none",
        "kv_cache_bytes": "1GiB", "gpu_memory_utilization": "0.9", "enable_prefix_caching": "False",
        "max_model_len": "", "watermark": "0.02", "speculative_method": "ngram", "num_speculative_tokens": "3",
        "device": "cpu", "EXECUTION_ENV_PATH": "/envs/py.tar.gz",     # Triton's Python backend reads it
    })
    assert (c.model_path, c.block_size, c.num_kv_blocks, c.kv_cache_bytes) == ("/models/target", 32, None, 2**30)
    assert (c.gpu_memory_utilization, c.enable_prefix_caching, c.max_model_len) == (0.9, False, None)
    assert (c.speculative_method, c.num_speculative_tokens, c.device) == ("ngram", 3, "cpu")
    assert EngineConfig.from_parameters({"model_path": "/m", "kv_cache_bytes": "512MB"}).kv_cache_bytes == 512 * 10**6
    assert EngineConfig.from_parameters({"model_path": "/m", "kv_cache_bytes": "none"}).kv_cache_bytes is None


@pytest.mark.parametrize("params, field", [
    ({}, "model_path"),
    ({"model_path": "/m", "block_size": "sixteen"}, "block_size"),
    ({"model_path": "/m", "enable_prefix_caching": "maybe"}, "enable_prefix_caching"),
    ({"model_path": "/m", "kv_cache_bytes": "lots"}, "kv_cache_bytes"),
    ({"model_path": "/m", "watermark": "0.x"}, "watermark"),
    ({"model_path": "/m", "max_num_seq": "8"}, "max_num_seq"),       # a typo is not silently ignored
    ({"model_path": "/m", "tokenizer_dir": "/t"}, "tokenizer_dir"),   # nor any key that is not a field
    ({"model_path": "/m", "block_size": "24"}, "block_size"),        # parsed, then validated
])
def test_from_parameters_errors_name_the_parameter(params, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        EngineConfig.from_parameters(params)


def test_guided_decoding_parameters():
    c = EngineConfig.from_parameters({"model_path": "/m", "guided_compile_timeout_s": "2.5",
                                      "guided_compile_workers": "4"})
    assert (c.guided_compile_timeout_s, c.guided_compile_workers) == (2.5, 4)
    assert EngineConfig.from_parameters({"model_path": "/m", "guided_jump_forward": "true"}).guided_jump_forward
    assert EngineConfig(model_path="/m").guided_jump_forward is False
    default = EngineConfig(model_path="/m")
    assert (default.guided_compile_timeout_s, default.guided_compile_workers) == (10.0, 2)
    for kwargs, field in ((dict(guided_compile_timeout_s=0), "guided_compile_timeout_s"),
                          (dict(guided_compile_timeout_s=float("inf")), "guided_compile_timeout_s"),
                          (dict(guided_compile_workers=0), "guided_compile_workers"),
                          (dict(guided_jump_forward="yes"), "guided_jump_forward")):
        with pytest.raises(ValueError, match=f"^{field}"):
            EngineConfig(model_path="/m", **kwargs)


def test_fast_decode_parameter():
    assert EngineConfig(model_path="/m").fast_decode is False     # unit tests stay on the eager path
    assert EngineConfig.from_parameters({"model_path": "/m", "fast_decode": "true"}).fast_decode is True
    with pytest.raises(ValueError, match="^fast_decode"):
        EngineConfig(model_path="/m", fast_decode="yes")
    with pytest.raises(ValueError, match="^fast_decode"):
        EngineConfig.from_parameters({"model_path": "/m", "fast_decode": "sometimes"})


def test_python_switch_interval_parameter():
    assert EngineConfig(model_path="/m").python_switch_interval_ms == 0.0     # Python's own, untouched
    cfg = EngineConfig.from_parameters({"model_path": "/m", "python_switch_interval_ms": "0.5"})
    assert cfg.python_switch_interval_ms == 0.5
    for bad in (-1.0, 0.001, 5000.0, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="^python_switch_interval_ms"):
            EngineConfig(model_path="/m", python_switch_interval_ms=bad)


def test_test_step_delay_parameter_is_for_tests_only():
    from backend.config import TEST_ONLY_PARAMETERS

    assert EngineConfig(model_path="/m").test_step_delay_s == 0.0          # off unless a test sets it
    assert EngineConfig.from_parameters({"model_path": "/m", "test_step_delay_s": "0.05"}).test_step_delay_s == 0.05
    for bad in (-0.01, 11.0, float("nan"), float("inf"), True, "0.05"):
        with pytest.raises(ValueError, match="^test_step_delay_s"):
            EngineConfig(model_path="/m", test_step_delay_s=bad)
    with pytest.raises(ValueError, match="^test_step_delay_s"):
        EngineConfig.from_parameters({"model_path": "/m", "test_step_delay_s": "slow"})
    fields = {f.name for f in __import__("dataclasses").fields(EngineConfig)}
    assert "test_step_delay_s" in TEST_ONLY_PARAMETERS and set(TEST_ONLY_PARAMETERS) <= fields
