"""``config.pbtxt`` parameter strings to engine setting values: one parser per setting (``PARSERS``).

An empty value means "use the default" (the caller skips it); ``none``/``null`` sets an optional setting to
None. Every error names the parameter.
"""
from __future__ import annotations

import re

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_NONE = ("none", "null")
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
               "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_int(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key}: expected an integer, got {value!r}") from None


def parse_float(key: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{key}: expected a number, got {value!r}") from None


def parse_bool(key: str, value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(f"{key}: expected true or false, got {value!r}")


def parse_bytes(key: str, value: str) -> int:
    """``268435456``, ``256MiB``, ``1.5GiB``, ``512MB``."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-zA-Z]*)", value)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"{key}: expected a byte count such as 268435456 or 256MiB, got {value!r}")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def optional(parse):
    def parse_optional(key: str, value: str):
        return None if value.lower() in _NONE else parse(key, value)
    return parse_optional


def parse_str(key: str, value: str) -> str:
    return value


def parse_lora_adapters(key: str, value: str) -> tuple[tuple[str, str], ...]:
    """``name=folder,name2=folder2`` (folders relative to the repository root are resolved by the builder)."""
    pairs = []
    for item in value.split(","):
        name, eq, folder = item.strip().partition("=")
        if not eq or not name.strip() or not folder.strip():
            raise ValueError(f"{key}: expected name=folder pairs separated by commas, got {item.strip()!r}")
        pairs.append((name.strip(), folder.strip()))
    return tuple(pairs)


# every engine setting's parser, by its parameter name (tests/backend/test_config.py: exactly the settings)
PARSERS = {
    # model
    "model_path": parse_str, "dtype": parse_str, "quantization": parse_str, "quantization_group_size": parse_int,
    "max_model_len": optional(parse_int), "seed": parse_int,
    # cache
    "block_size": parse_int, "num_kv_blocks": optional(parse_int), "kv_cache_bytes": optional(parse_bytes),
    "gpu_memory_utilization": parse_float, "enable_prefix_caching": parse_bool, "watermark": parse_float,
    "kv_cache_dtype": parse_str,
    # scheduler
    "max_num_seqs": parse_int, "max_queued_requests": parse_int, "max_num_batched_tokens": parse_int,
    "stream_interval": parse_int, "stream_responses_per_s": parse_float,
    # speculative
    "speculative_method": parse_str, "num_speculative_tokens": parse_int, "draft_model_path": optional(parse_str),
    "ngram_min": parse_int, "ngram_max": parse_int, "speculative_adaptive": parse_bool, "draft_coupling": parse_str,
    # structured output
    "guided_compile_timeout_s": parse_float, "guided_compile_workers": parse_int, "guided_jump_forward": parse_bool,
    # lora
    "lora_adapters": optional(parse_lora_adapters), "lora_dir": optional(parse_str), "max_loras": parse_int,
    "max_cpu_loras": optional(parse_int), "max_lora_rank": parse_int,
    # execution
    "device": parse_str, "cpu_threads": parse_int, "fast_decode": parse_bool, "python_switch_interval_ms": parse_float,
    "test_step_delay_s": parse_float,
}
