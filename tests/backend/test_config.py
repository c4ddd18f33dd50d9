"""EngineConfig: its groups, validation naming the field, and parsing of Triton string parameters."""
from __future__ import annotations

import dataclasses

import pytest

from backend.config import GROUPS, SETTING_GROUPS, EngineConfig, SchedulerConfig, ServedModelConfig
from backend.config.parameters import PARSERS

MAX_GROUP_FIELDS = 12


def test_each_group_is_small_frozen_and_every_setting_has_one_group_and_one_parser():
    assert [f.name for f in dataclasses.fields(EngineConfig)] == list(GROUPS)
    names = [f.name for cls in GROUPS.values() for f in dataclasses.fields(cls)]
    assert len(names) == len(set(names)) == len(SETTING_GROUPS)      # no setting in two groups
    assert set(PARSERS) == set(SETTING_GROUPS)
    for cls in GROUPS.values():
        assert len(dataclasses.fields(cls)) <= MAX_GROUP_FIELDS, cls.__name__
        assert cls.__dataclass_params__.frozen, cls.__name__


def test_defaults_and_resolved_max_model_len():
    c = EngineConfig.from_settings(model_path="/m")
    assert (c.cache.block_size, c.cache.kv_cache_bytes, c.scheduler.max_num_seqs,
            c.scheduler.max_num_batched_tokens) == (16, None, 64, 1024)
    assert c.cache.num_kv_blocks is None and c.cache.enable_prefix_caching and not c.speculative.enabled
    assert not c.lora.enabled
    assert c.model.resolve_max_model_len(4096) == 4096
    assert EngineConfig.from_settings(model_path="/m", max_model_len=512).model.resolve_max_model_len(4096) == 512
    with pytest.raises(ValueError, match="max_model_len"):
        EngineConfig.from_settings(model_path="/m", max_model_len=8192).model.resolve_max_model_len(4096)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.cache.block_size = 32
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.cache = c.cache


def test_groups_compose_directly_and_flat_settings_land_in_their_group():
    direct = EngineConfig(ServedModelConfig(model_path="/m"), scheduler=SchedulerConfig(max_num_seqs=8))
    assert direct == EngineConfig.from_settings(model_path="/m", max_num_seqs=8)
    changed = direct.with_settings(max_num_seqs=4, block_size=32, fast_decode=True)
    assert (changed.scheduler.max_num_seqs, changed.cache.block_size, changed.execution.fast_decode) == (4, 32, True)
    assert direct.scheduler.max_num_seqs == 8 and changed.model is direct.model     # a copy; untouched groups shared
    with pytest.raises(ValueError, match="^block_size"):
        direct.with_settings(block_size=24)                                            # validated again
    with pytest.raises(ValueError, match="^max_num_seq: not an engine setting"):
        EngineConfig.from_settings(model_path="/m", max_num_seq=8)
    with pytest.raises(ValueError, match="^scheduler: expected a SchedulerConfig"):
        EngineConfig(ServedModelConfig(model_path="/m"), scheduler={"max_num_seqs": 8})


def test_lora_over_a_quantized_base_is_refused_across_groups():
    with pytest.raises(ValueError, match="^lora_adapters: LoRA over a quantized base"):
        EngineConfig.from_settings(model_path="/m", quantization="int8", lora_adapters=(("a", "/a"),))
    base = EngineConfig.from_settings(model_path="/m", lora_dir="/adapters")
    with pytest.raises(ValueError, match="^lora_adapters: LoRA over a quantized base"):
        base.with_settings(quantization="int4")


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
    (dict(stream_responses_per_s=-1.0), "stream_responses_per_s"),
    (dict(device="tpu"), "device"),
    (dict(dtype="int8"), "dtype"),
    (dict(num_speculative_tokens=-1), "num_speculative_tokens"),
    (dict(num_speculative_tokens=0), "num_speculative_tokens"),
    (dict(num_speculative_tokens=17), "num_speculative_tokens"),
    (dict(speculative_method="medusa", num_speculative_tokens=2), "speculative_method"),
    (dict(speculative_method=None), "speculative_method"),
    (dict(speculative_method="draft", num_speculative_tokens=2), "draft_model_path"),
    (dict(draft_coupling="rejection"), "draft_coupling"),
    (dict(ngram_min=0), "ngram_min"),
    (dict(ngram_min=5, ngram_max=4), "ngram_min"),
    (dict(ngram_max=65), "ngram_max"),
    (dict(speculative_adaptive="yes"), "speculative_adaptive"),
    (dict(seed=-1), "seed"),
    (dict(quantization="int3"), "quantization"),
    (dict(kv_cache_dtype="int4"), "kv_cache_dtype"),
    (dict(cpu_threads=-1), "cpu_threads"),
    (dict(max_loras=0), "max_loras"),
    (dict(max_loras=4, max_cpu_loras=2), "max_cpu_loras"),
    (dict(lora_adapters=(("bad name", "/a"),)), "lora_adapters"),
])
def test_invalid_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        EngineConfig.from_settings(**{"model_path": "/m", **kwargs})


def test_valid_variants():
    EngineConfig.from_settings(model_path="/m", device="cuda:1", dtype="bfloat16", watermark=0.0, num_kv_blocks=100)
    c = EngineConfig.from_settings(model_path="/m", draft_model_path="/d", speculative_method="draft",
                                   num_speculative_tokens=4)
    assert c.speculative.enabled
    k_only = EngineConfig.from_settings(model_path="/m", num_speculative_tokens=7)
    assert not k_only.speculative.enabled     # k without a method: off


def test_from_parameters_parses_strings_and_triton_dicts():
    c = EngineConfig.from_parameters({
        "model_path": {"string_value": "/models/target"}, "block_size": "32", "num_kv_blocks": "none",
        "kv_cache_bytes": "1GiB", "gpu_memory_utilization": "0.9", "enable_prefix_caching": "False",
        "max_model_len": "", "watermark": "0.02", "speculative_method": "ngram", "num_speculative_tokens": "3",
        "device": "cpu", "EXECUTION_ENV_PATH": "/envs/py.tar.gz",     # Triton's Python backend reads it
    })
    assert (c.model.model_path, c.cache.block_size, c.cache.num_kv_blocks,
            c.cache.kv_cache_bytes) == ("/models/target", 32, None, 2**30)
    assert (c.cache.gpu_memory_utilization, c.cache.enable_prefix_caching, c.model.max_model_len) == (0.9, False, None)
    assert (c.speculative.speculative_method, c.speculative.num_speculative_tokens,
            c.execution.device) == ("ngram", 3, "cpu")
    assert EngineConfig.from_parameters({"model_path": "/m", "kv_cache_bytes": "512MB"}).cache.kv_cache_bytes \
        == 512 * 10**6
    assert EngineConfig.from_parameters({"model_path": "/m", "kv_cache_bytes": "none"}).cache.kv_cache_bytes is None
    lora = EngineConfig.from_parameters({"model_path": "/m", "lora_adapters": "a=/x, b=rel/y", "max_loras": "2"}).lora
    assert (lora.lora_adapters, lora.max_loras, lora.enabled) == ((("a", "/x"), ("b", "rel/y")), 2, True)


@pytest.mark.parametrize("params, field", [
    ({}, "model_path"),
    ({"model_path": "/m", "block_size": "sixteen"}, "block_size"),
    ({"model_path": "/m", "enable_prefix_caching": "maybe"}, "enable_prefix_caching"),
    ({"model_path": "/m", "kv_cache_bytes": "lots"}, "kv_cache_bytes"),
    ({"model_path": "/m", "watermark": "0.x"}, "watermark"),
    ({"model_path": "/m", "max_num_seq": "8"}, "max_num_seq"),       # a typo is not silently ignored
    ({"model_path": "/m", "tokenizer_dir": "/t"}, "tokenizer_dir"),   # nor any key that is not a field
    ({"model_path": "/m", "block_size": "24"}, "block_size"),        # parsed, then validated
    ({"model_path": "/m", "cache": "x"}, "cache"),                   # a group's name is not a parameter
])
def test_from_parameters_errors_name_the_parameter(params, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        EngineConfig.from_parameters(params)


def test_guided_decoding_parameters():
    c = EngineConfig.from_parameters({"model_path": "/m", "guided_compile_timeout_s": "2.5",
                                      "guided_compile_workers": "4"}).structured_output
    assert (c.guided_compile_timeout_s, c.guided_compile_workers) == (2.5, 4)
    jump = EngineConfig.from_parameters({"model_path": "/m", "guided_jump_forward": "true"})
    assert jump.structured_output.guided_jump_forward
    default = EngineConfig.from_settings(model_path="/m").structured_output
    assert (default.guided_compile_timeout_s, default.guided_compile_workers, default.guided_jump_forward) \
        == (10.0, 2, False)
    for kwargs, field in ((dict(guided_compile_timeout_s=0), "guided_compile_timeout_s"),
                          (dict(guided_compile_timeout_s=float("inf")), "guided_compile_timeout_s"),
                          (dict(guided_compile_workers=0), "guided_compile_workers"),
                          (dict(guided_jump_forward="yes"), "guided_jump_forward")):
        with pytest.raises(ValueError, match=f"^{field}"):
            EngineConfig.from_settings(model_path="/m", **kwargs)


def test_fast_decode_parameter():
    assert EngineConfig.from_settings(model_path="/m").execution.fast_decode is False   # unit tests stay eager
    assert EngineConfig.from_parameters({"model_path": "/m", "fast_decode": "true"}).execution.fast_decode is True
    with pytest.raises(ValueError, match="^fast_decode"):
        EngineConfig.from_settings(model_path="/m", fast_decode="yes")
    with pytest.raises(ValueError, match="^fast_decode"):
        EngineConfig.from_parameters({"model_path": "/m", "fast_decode": "sometimes"})


def test_python_switch_interval_parameter():
    assert EngineConfig.from_settings(model_path="/m").execution.python_switch_interval_ms == 0.0   # Python's own
    cfg = EngineConfig.from_parameters({"model_path": "/m", "python_switch_interval_ms": "0.5"})
    assert cfg.execution.python_switch_interval_ms == 0.5
    for bad in (-1.0, 0.001, 5000.0, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="^python_switch_interval_ms"):
            EngineConfig.from_settings(model_path="/m", python_switch_interval_ms=bad)


def test_test_step_delay_parameter_is_for_tests_only():
    from backend.config import TEST_ONLY_PARAMETERS

    assert EngineConfig.from_settings(model_path="/m").execution.test_step_delay_s == 0.0   # off unless a test sets it
    cfg = EngineConfig.from_parameters({"model_path": "/m", "test_step_delay_s": "0.05"})
    assert cfg.execution.test_step_delay_s == 0.05
    for bad in (-0.01, 11.0, float("nan"), float("inf"), True, "0.05"):
        with pytest.raises(ValueError, match="^test_step_delay_s"):
            EngineConfig.from_settings(model_path="/m", test_step_delay_s=bad)
    with pytest.raises(ValueError, match="^test_step_delay_s"):
        EngineConfig.from_parameters({"model_path": "/m", "test_step_delay_s": "slow"})
    assert "test_step_delay_s" in TEST_ONLY_PARAMETERS and set(TEST_ONLY_PARAMETERS) <= set(SETTING_GROUPS)
