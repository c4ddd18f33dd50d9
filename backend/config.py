"""``EngineConfig``: every engine setting, validated once, built from Triton ``config.pbtxt`` parameters.

Units: ``block_size`` and ``max_num_batched_tokens`` count tokens; ``kv_cache_bytes`` counts
bytes of K+V over all layers; ``watermark`` and ``gpu_memory_utilization`` are fractions.
Every check raises ``ValueError`` naming the field, so a bad ``config.pbtxt`` fails model
loading with a message that says which parameter to fix.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Mapping

from contracts.triton_config import TRITON_PARAMETERS, check_known_parameters
from contracts.validation import check_int as _check_int

DEVICES = ("auto", "cpu", "cuda")          # plus "cuda:N"
DTYPES = ("auto", "float32", "float16", "bfloat16")
SPECULATIVE_METHODS = ("none", "ngram", "draft")
DRAFT_COUPLINGS = ("gumbel", "rejection")
MAX_SPECULATIVE_TOKENS = 16
MAX_NGRAM = 64
SWITCH_INTERVAL_MS = (0.01, 1000.0)         # python_switch_interval_ms when not 0 (CPython counts whole microseconds)
QUANTIZATION_MODES = ("none", "int8", "int4", "fp8")
KV_CACHE_DTYPES = ("auto", "int8", "fp8")   # backend/core/kv_quant.py
LORA_NAME = r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}"   # an adapter's name (the OpenAI API's model field selects it)
# Settings meant for tests only: never for serving, so the Helm chart's engine values leave them out.
TEST_ONLY_PARAMETERS = ("test_step_delay_s",)


@dataclass(frozen=True)
class EngineConfig:
    model_path: str
    draft_model_path: str | None = None
    block_size: int = 16                       # tokens per KV block (a power of two)
    num_kv_blocks: int | None = None           # None: sized from kv_cache_bytes, else from memory (below)
    kv_cache_bytes: int | None = None          # the target's KV byte budget; None: 256 MiB on CPU, on CUDA
                                               # what gpu_memory_utilization leaves after weights (draft included)
    gpu_memory_utilization: float = 0.85       # fraction of GPU memory the engine may use (weights + KV + activations)
    max_num_seqs: int = 64                     # sequences running at once
    max_queued_requests: int = 256             # requests held beyond max_num_seqs; the next one is refused
                                               # at once (backend/engine/inbox.py queue_full_error)
    max_num_batched_tokens: int = 1024         # tokens computed per step (prefill chunks + decodes + drafts)
    max_model_len: int | None = None           # None: the model's max_position_embeddings
    enable_prefix_caching: bool = True
    watermark: float = 0.01                    # fraction of blocks kept free when admitting new sequences
    stream_interval: int = 1                   # emit every k tokens at most (the first token and the last always)
    stream_responses_per_s: float = 0.0        # > 0: adapt the interval to this response budget (0: fixed)
    device: str = "auto"
    dtype: str = "auto"
    speculative_method: str = "none"           # none | ngram (prompt lookup) | draft (draft_model_path)
    num_speculative_tokens: int = 4            # the most drafts per step (k); ignored when the method is none
    ngram_min: int = 1                         # ngram: shortest suffix matched against the context
    ngram_max: int = 4                         # ngram: longest suffix matched (tried first)
    speculative_adaptive: bool = True          # choose k per request from measured acceptance and step costs
    draft_coupling: str = "gumbel"             # draft: gumbel (shared noise: seeded output replays exactly) |
                                               # rejection (standard speculative sampling with the draft's q)
    quantization: str = "none"                 # weight-only: none | int8 | int4 | fp8 (CUDA); backend/model/quant.py
    quantization_group_size: int = 128         # int4: input columns per scale
    kv_cache_dtype: str = "auto"               # KV storage: auto (compute dtype) | int8 | fp8 (CUDA); + fp16 scales
    seed: int = 0
    cpu_threads: int = 0                       # torch intra-op threads on CPU (0: torch's default, one per core)
    guided_compile_timeout_s: float = 10.0     # a guided request fails when its grammar takes longer to compile
    guided_compile_workers: int = 2            # grammar compile threads (a timed-out compile keeps its thread)
    guided_jump_forward: bool = False          # append the tokens a grammar forces without a forward pass each
    fast_decode: bool = False                  # every CPU step through the native fused forward (fp32); CUDA graphs
    python_switch_interval_ms: float = 0.0     # > 0: sys.setswitchinterval while the loop runs (process-wide)
    lora_adapters: tuple[tuple[str, str], ...] | None = None   # LoRA adapters: (name, PEFT folder) pairs (docs/lora.md)
    lora_dir: str | None = None                # also serve every adapter sub-folder of this folder, by its name
    max_loras: int = 4                         # adapters resident in a step's stacked weights at once
    max_cpu_loras: int | None = None           # adapters kept loaded in memory (None: every served one)
    max_lora_rank: int = 16                    # the highest rank of any adapter module (the stacks' width)
    test_step_delay_s: float = 0.0             # TESTS ONLY (TEST_ONLY_PARAMETERS): the loop sleeps this long after each
                                               # step, outside the step's timing, so that a request of N tokens lasts
                                               # at least ceil(N / (1 + num_speculative_tokens)) delays on any CPU;
                                               # an abort or shutdown ends the sleep early. 0: no sleep

    def __post_init__(self) -> None:
        _check_str("model_path", self.model_path)
        if self.draft_model_path is not None:
            _check_str("draft_model_path", self.draft_model_path)
        _check_int("block_size", self.block_size, lo=1, hi=1024)
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size: must be a power of two, got {self.block_size}")
        if self.num_kv_blocks is not None:
            _check_int("num_kv_blocks", self.num_kv_blocks, lo=1)
        if self.kv_cache_bytes is not None:
            _check_int("kv_cache_bytes", self.kv_cache_bytes, lo=1)
        _check_fraction("gpu_memory_utilization", self.gpu_memory_utilization, lo_open=True)
        _check_int("max_num_seqs", self.max_num_seqs, lo=1)
        _check_int("max_queued_requests", self.max_queued_requests, lo=0)
        _check_int("max_num_batched_tokens", self.max_num_batched_tokens, lo=1)
        if self.max_model_len is not None:
            _check_int("max_model_len", self.max_model_len, lo=2)
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(f"enable_prefix_caching: expected a boolean, got {self.enable_prefix_caching!r}")
        _check_fraction("watermark", self.watermark, hi_open=True)
        _check_int("stream_interval", self.stream_interval, lo=1)
        if isinstance(self.stream_responses_per_s, bool) or not isinstance(self.stream_responses_per_s, (int, float)) \
                or not math.isfinite(self.stream_responses_per_s) or self.stream_responses_per_s < 0:
            raise ValueError(f"stream_responses_per_s: expected a finite number >= 0, got {self.stream_responses_per_s!r}")
        if not isinstance(self.device, str) or not (self.device in DEVICES or re.fullmatch(r"cuda:\d+", self.device)):
            raise ValueError(f"device: expected one of {DEVICES} or 'cuda:N', got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {DTYPES}, got {self.dtype!r}")
        if self.speculative_method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_method: expected one of {SPECULATIVE_METHODS}, "
                             f"got {self.speculative_method!r}")
        _check_int("num_speculative_tokens", self.num_speculative_tokens, lo=1, hi=MAX_SPECULATIVE_TOKENS)
        _check_int("ngram_min", self.ngram_min, lo=1, hi=MAX_NGRAM)
        _check_int("ngram_max", self.ngram_max, lo=1, hi=MAX_NGRAM)
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min: {self.ngram_min} exceeds ngram_max ({self.ngram_max})")
        if not isinstance(self.speculative_adaptive, bool):
            raise ValueError(f"speculative_adaptive: expected a boolean, got {self.speculative_adaptive!r}")
        if self.draft_coupling not in DRAFT_COUPLINGS:
            raise ValueError(f"draft_coupling: expected one of {DRAFT_COUPLINGS}, got {self.draft_coupling!r}")
        if self.draft_coupling != "gumbel" and self.speculative_method != "draft":
            raise ValueError(f"draft_coupling: {self.draft_coupling!r} applies to speculative_method 'draft' only")
        if self.speculative_method == "draft" and self.draft_model_path is None:
            raise ValueError("draft_model_path: required when speculative_method is 'draft'")
        if self.quantization not in QUANTIZATION_MODES:
            raise ValueError(f"quantization: expected one of {QUANTIZATION_MODES}, got {self.quantization!r}")
        _check_int("quantization_group_size", self.quantization_group_size, lo=2, hi=1 << 16)
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype: expected one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        _check_int("seed", self.seed, lo=0, hi=2**63 - 1)
        _check_int("cpu_threads", self.cpu_threads, lo=0, hi=1024)
        t = self.guided_compile_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < math.inf:
            raise ValueError(f"guided_compile_timeout_s: must be a number > 0, got {t!r}")
        _check_int("guided_compile_workers", self.guided_compile_workers, lo=1, hi=64)
        if not isinstance(self.guided_jump_forward, bool):
            raise ValueError(f"guided_jump_forward: expected a boolean, got {self.guided_jump_forward!r}")
        if not isinstance(self.fast_decode, bool):
            raise ValueError(f"fast_decode: expected a boolean, got {self.fast_decode!r}")
        si = self.python_switch_interval_ms
        lo, hi = SWITCH_INTERVAL_MS
        if isinstance(si, bool) or not isinstance(si, (int, float)) or not (si == 0 or lo <= si <= hi):
            raise ValueError(f"python_switch_interval_ms: expected 0 (leave Python's) or a number in [{lo}, {hi}], "
                             f"got {si!r}")
        d = self.test_step_delay_s
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= 10:
            raise ValueError(f"test_step_delay_s: expected seconds in [0, 10] (a setting for tests only), got {d!r}")
        self._check_lora()

    def _check_lora(self) -> None:
        if self.lora_adapters is not None and not isinstance(self.lora_adapters, tuple):
            raise ValueError(f"lora_adapters: expected (name, folder) pairs, got {self.lora_adapters!r}")
        for pair in self.lora_adapters or ():
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
                raise ValueError(f"lora_adapters: expected (name, folder) pairs, got {pair!r}")
            if not re.fullmatch(LORA_NAME, pair[0]):
                raise ValueError(f"lora_adapters: adapter name {pair[0]!r} must match {LORA_NAME}")
            _check_str("lora_adapters", pair[1])
        if self.lora_dir is not None:
            _check_str("lora_dir", self.lora_dir)
        _check_int("max_loras", self.max_loras, lo=1, hi=256)
        _check_int("max_lora_rank", self.max_lora_rank, lo=1, hi=1024)
        if self.max_cpu_loras is not None:
            _check_int("max_cpu_loras", self.max_cpu_loras, lo=1)
            if self.max_cpu_loras < self.max_loras:
                raise ValueError(f"max_cpu_loras: {self.max_cpu_loras} is below max_loras ({self.max_loras})")
        if self.lora_enabled and self.quantization != "none":
            raise ValueError(f"lora_adapters: LoRA over a quantized base (quantization={self.quantization!r}) "
                             "is not supported")

    @property
    def lora_enabled(self) -> bool:
        """The engine serves LoRA adapters (configured by name or by folder)."""
        return bool(self.lora_adapters) or self.lora_dir is not None

    @property
    def speculative(self) -> bool:
        return self.speculative_method != "none"

    def resolve_max_model_len(self, max_position_embeddings: int) -> int:
        """The context length to serve: ``max_model_len`` if set (never beyond the model's), else the model's."""
        if self.max_model_len is None:
            return max_position_embeddings
        if self.max_model_len > max_position_embeddings:
            raise ValueError(f"max_model_len: {self.max_model_len} exceeds the model's "
                             f"max_position_embeddings ({max_position_embeddings})")
        return self.max_model_len

    @classmethod
    def from_parameters(cls, params: Mapping[str, object]) -> "EngineConfig":
        """Build from Triton ``config.pbtxt`` parameters (keys are the field names).

        Values are strings, or Triton's ``{"string_value": "..."}`` dicts. An empty value means
        "use the default"; ``none``/``null`` sets an optional field to None. Every other key is
        refused, naming it (``check_known_parameters``), but Triton's Python backend's own
        (``TRITON_PARAMETERS``); the llm model takes its serving parameters off first.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        check_known_parameters("llm", params, fields)
        kwargs: dict[str, object] = {}
        for key, raw in params.items():
            value = raw.get("string_value", "") if isinstance(raw, Mapping) else raw
            if key in TRITON_PARAMETERS:
                continue
            if not isinstance(value, str):
                raise ValueError(f"{key}: expected a string parameter value, got {value!r}")
            value = value.strip()
            if value == "":
                continue
            kwargs[key] = _PARSERS[key](key, value)
        if "model_path" not in kwargs:
            raise ValueError("model_path: required engine parameter is missing")
        return cls(**kwargs)


# ---- parsing of string parameters ---------------------------------------------------------------

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_NONE = ("none", "null")
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
               "kib": 2**10, "mib": 2**20, "gib": 2**30}


def _parse_int(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key}: expected an integer, got {value!r}") from None


def _parse_float(key: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{key}: expected a number, got {value!r}") from None


def _parse_bool(key: str, value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(f"{key}: expected true or false, got {value!r}")


def _parse_bytes(key: str, value: str) -> int:
    """``268435456``, ``256MiB``, ``1.5GiB``, ``512MB``."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-zA-Z]*)", value)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"{key}: expected a byte count such as 268435456 or 256MiB, got {value!r}")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def _optional(parse):
    def parse_optional(key: str, value: str):
        return None if value.lower() in _NONE else parse(key, value)
    return parse_optional


def _parse_str(key: str, value: str) -> str:
    return value


def _parse_lora_adapters(key: str, value: str) -> tuple[tuple[str, str], ...]:
    """``name=folder,name2=folder2`` (folders relative to the repository root are resolved by the builder)."""
    pairs = []
    for item in value.split(","):
        name, eq, folder = item.strip().partition("=")
        if not eq or not name.strip() or not folder.strip():
            raise ValueError(f"{key}: expected name=folder pairs separated by commas, got {item.strip()!r}")
        pairs.append((name.strip(), folder.strip()))
    return tuple(pairs)


_PARSERS = {
    "model_path": _parse_str, "draft_model_path": _optional(_parse_str), "block_size": _parse_int,
    "num_kv_blocks": _optional(_parse_int), "kv_cache_bytes": _optional(_parse_bytes),
    "gpu_memory_utilization": _parse_float, "max_num_seqs": _parse_int, "max_num_batched_tokens": _parse_int,
    "max_queued_requests": _parse_int,
    "max_model_len": _optional(_parse_int), "enable_prefix_caching": _parse_bool, "watermark": _parse_float,
    "stream_interval": _parse_int, "stream_responses_per_s": _parse_float, "device": _parse_str, "dtype": _parse_str,
    "num_speculative_tokens": _parse_int, "speculative_method": _parse_str, "ngram_min": _parse_int,
    "ngram_max": _parse_int, "speculative_adaptive": _parse_bool,
    "draft_coupling": _parse_str, "seed": _parse_int, "cpu_threads": _parse_int,
    "quantization": _parse_str, "quantization_group_size": _parse_int, "kv_cache_dtype": _parse_str,
    "guided_compile_timeout_s": _parse_float, "guided_compile_workers": _parse_int, "guided_jump_forward": _parse_bool,
    "fast_decode": _parse_bool, "python_switch_interval_ms": _parse_float,
    "lora_adapters": _optional(_parse_lora_adapters), "lora_dir": _optional(_parse_str), "max_loras": _parse_int,
    "max_cpu_loras": _optional(_parse_int), "max_lora_rank": _parse_int,
    "test_step_delay_s": _parse_float,
}


# ---- checks -------------------------------------------------------------------------------------

def _check_str(name: str, value) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name}: expected a non-empty string, got {value!r}")


def _check_fraction(name: str, value, lo_open: bool = False, hi_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    if (value <= 0 if lo_open else value < 0) or (value >= 1 if hi_open else value > 1):
        raise ValueError(f"{name}: must be in {'(' if lo_open else '['}0, 1{')' if hi_open else ']'}, got {value}")
