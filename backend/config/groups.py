"""The engine's sub-configs, one per concern (as vLLM keeps its model, cache, scheduler, speculative and LoRA
configs apart). Each is frozen and checks its own fields, every ``ValueError`` naming the field. A field's name
is its ``config.pbtxt`` parameter's (``EngineConfig.from_parameters`` maps each flat key to its group).

Units: ``block_size`` and ``max_num_batched_tokens`` count tokens; ``kv_cache_bytes`` counts bytes of K+V over
all layers; ``watermark`` and ``gpu_memory_utilization`` are fractions.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from backend.config.checks import check_bool, check_choice, check_fraction, check_int, check_str, is_number

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


@dataclass(frozen=True)
class ServedModelConfig:
    """The checkpoint served and how its weights are computed."""
    model_path: str
    dtype: str = "auto"
    quantization: str = "none"                 # weight-only: none | int8 | int4 | fp8 (CUDA); backend/model/quant.py
    quantization_group_size: int = 128         # int4: input columns per scale
    max_model_len: int | None = None           # None: the model's max_position_embeddings
    seed: int = 0                              # the engine's seeds for unseeded sampled requests

    def __post_init__(self) -> None:
        check_str("model_path", self.model_path)
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("quantization", self.quantization, QUANTIZATION_MODES)
        check_int("quantization_group_size", self.quantization_group_size, lo=2, hi=1 << 16)
        if self.max_model_len is not None:
            check_int("max_model_len", self.max_model_len, lo=2)
        check_int("seed", self.seed, lo=0, hi=2**63 - 1)

    def resolve_max_model_len(self, max_position_embeddings: int) -> int:
        """The context length to serve: ``max_model_len`` if set (never beyond the model's), else the model's."""
        if self.max_model_len is None:
            return max_position_embeddings
        if self.max_model_len > max_position_embeddings:
            raise ValueError(f"max_model_len: {self.max_model_len} exceeds the model's "
                             f"max_position_embeddings ({max_position_embeddings})")
        return self.max_model_len


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache: its blocks, its size, its storage, the prefix cache."""
    block_size: int = 16                       # tokens per KV block (a power of two)
    num_kv_blocks: int | None = None           # None: sized from kv_cache_bytes, else from memory (below)
    kv_cache_bytes: int | None = None          # the target's KV byte budget; None: 256 MiB on CPU, on CUDA
                                               # what gpu_memory_utilization leaves after weights (draft included)
    gpu_memory_utilization: float = 0.85       # fraction of GPU memory the engine may use (weights + KV + activations)
    enable_prefix_caching: bool = True
    watermark: float = 0.01                    # fraction of blocks kept free when admitting new sequences
    kv_cache_dtype: str = "auto"               # KV storage: auto (compute dtype) | int8 | fp8 (CUDA); + fp16 scales

    def __post_init__(self) -> None:
        check_int("block_size", self.block_size, lo=1, hi=1024)
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size: must be a power of two, got {self.block_size}")
        if self.num_kv_blocks is not None:
            check_int("num_kv_blocks", self.num_kv_blocks, lo=1)
        if self.kv_cache_bytes is not None:
            check_int("kv_cache_bytes", self.kv_cache_bytes, lo=1)
        check_fraction("gpu_memory_utilization", self.gpu_memory_utilization, lo_open=True)
        check_bool("enable_prefix_caching", self.enable_prefix_caching)
        check_fraction("watermark", self.watermark, hi_open=True)
        check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)


@dataclass(frozen=True)
class SchedulerConfig:
    """What runs at once, what waits, and how often a stream is answered."""
    max_num_seqs: int = 64                     # sequences running at once
    max_queued_requests: int = 256             # requests held beyond max_num_seqs; the next one is refused
                                               # at once (backend/engine/inbox.py queue_full_error)
    max_num_batched_tokens: int = 1024         # tokens computed per step (prefill chunks + decodes + drafts)
    stream_interval: int = 1                   # emit every k tokens at most (the first token and the last always)
    stream_responses_per_s: float = 0.0        # > 0: adapt the interval to this response budget (0: fixed)

    def __post_init__(self) -> None:
        check_int("max_num_seqs", self.max_num_seqs, lo=1)
        check_int("max_queued_requests", self.max_queued_requests, lo=0)
        check_int("max_num_batched_tokens", self.max_num_batched_tokens, lo=1)
        check_int("stream_interval", self.stream_interval, lo=1)
        r = self.stream_responses_per_s
        if not is_number(r) or not math.isfinite(r) or r < 0:
            raise ValueError(f"stream_responses_per_s: expected a finite number >= 0, got {r!r}")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding: the proposer, the most drafts per step, how drafts are verified."""
    speculative_method: str = "none"           # none | ngram (prompt lookup) | draft (draft_model_path)
    num_speculative_tokens: int = 4            # the most drafts per step (k); ignored when the method is none
    draft_model_path: str | None = None        # draft: the draft checkpoint
    ngram_min: int = 1                         # ngram: shortest suffix matched against the context
    ngram_max: int = 4                         # ngram: longest suffix matched (tried first)
    speculative_adaptive: bool = True          # choose k per request from measured acceptance and step costs
    draft_coupling: str = "gumbel"             # draft: gumbel (shared noise: seeded output replays exactly) |
                                               # rejection (standard speculative sampling with the draft's q)

    def __post_init__(self) -> None:
        if self.draft_model_path is not None:
            check_str("draft_model_path", self.draft_model_path)
        check_choice("speculative_method", self.speculative_method, SPECULATIVE_METHODS)
        check_int("num_speculative_tokens", self.num_speculative_tokens, lo=1, hi=MAX_SPECULATIVE_TOKENS)
        check_int("ngram_min", self.ngram_min, lo=1, hi=MAX_NGRAM)
        check_int("ngram_max", self.ngram_max, lo=1, hi=MAX_NGRAM)
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min: {self.ngram_min} exceeds ngram_max ({self.ngram_max})")
        check_bool("speculative_adaptive", self.speculative_adaptive)
        check_choice("draft_coupling", self.draft_coupling, DRAFT_COUPLINGS)
        if self.draft_coupling != "gumbel" and self.speculative_method != "draft":
            raise ValueError(f"draft_coupling: {self.draft_coupling!r} applies to speculative_method 'draft' only")
        if self.speculative_method == "draft" and self.draft_model_path is None:
            raise ValueError("draft_model_path: required when speculative_method is 'draft'")

    @property
    def enabled(self) -> bool:
        """A proposer drafts tokens (``speculative_method`` is not ``none``)."""
        return self.speculative_method != "none"


@dataclass(frozen=True)
class StructuredOutputConfig:
    """Guided decoding: grammar compiles and forced tokens."""
    guided_compile_timeout_s: float = 10.0     # a guided request fails when its grammar takes longer to compile
    guided_compile_workers: int = 2            # grammar compile threads (a timed-out compile keeps its thread)
    guided_jump_forward: bool = False          # append the tokens a grammar forces without a forward pass each

    def __post_init__(self) -> None:
        t = self.guided_compile_timeout_s
        if not is_number(t) or not 0 < t < math.inf:
            raise ValueError(f"guided_compile_timeout_s: must be a number > 0, got {t!r}")
        check_int("guided_compile_workers", self.guided_compile_workers, lo=1, hi=64)
        check_bool("guided_jump_forward", self.guided_jump_forward)


@dataclass(frozen=True)
class LoRAConfig:
    """LoRA adapters served (docs/lora.md), how many are resident in a step and in memory."""
    lora_adapters: tuple[tuple[str, str], ...] | None = None   # (name, PEFT folder) pairs
    lora_dir: str | None = None                # also serve every adapter sub-folder of this folder, by its name
    max_loras: int = 4                         # adapters resident in a step's stacked weights at once
    max_cpu_loras: int | None = None           # adapters kept loaded in memory (None: every served one)
    max_lora_rank: int = 16                    # the highest rank of any adapter module (the stacks' width)

    def __post_init__(self) -> None:
        if self.lora_adapters is not None and not isinstance(self.lora_adapters, tuple):
            raise ValueError(f"lora_adapters: expected (name, folder) pairs, got {self.lora_adapters!r}")
        for pair in self.lora_adapters or ():
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
                raise ValueError(f"lora_adapters: expected (name, folder) pairs, got {pair!r}")
            if not re.fullmatch(LORA_NAME, pair[0]):
                raise ValueError(f"lora_adapters: adapter name {pair[0]!r} must match {LORA_NAME}")
            check_str("lora_adapters", pair[1])
        if self.lora_dir is not None:
            check_str("lora_dir", self.lora_dir)
        check_int("max_loras", self.max_loras, lo=1, hi=256)
        check_int("max_lora_rank", self.max_lora_rank, lo=1, hi=1024)
        if self.max_cpu_loras is not None:
            check_int("max_cpu_loras", self.max_cpu_loras, lo=1)
            if self.max_cpu_loras < self.max_loras:
                raise ValueError(f"max_cpu_loras: {self.max_cpu_loras} is below max_loras ({self.max_loras})")

    @property
    def enabled(self) -> bool:
        """The engine serves LoRA adapters (configured by name or by folder)."""
        return bool(self.lora_adapters) or self.lora_dir is not None


@dataclass(frozen=True)
class ExecutionConfig:
    """Where and how the steps run: the device, CPU threads, the fast decode step, the loop thread."""
    device: str = "auto"
    cpu_threads: int = 0                       # torch intra-op threads on CPU (0: torch's default, one per core)
    fast_decode: bool = False                  # every CPU step through the native fused forward (fp32); CUDA graphs
    python_switch_interval_ms: float = 0.0     # > 0: sys.setswitchinterval while the loop runs (process-wide)
    test_step_delay_s: float = 0.0             # TESTS ONLY (TEST_ONLY_PARAMETERS): the loop sleeps this long after each
                                               # step, outside the step's timing, so that a request of N tokens lasts
                                               # at least ceil(N / (1 + num_speculative_tokens)) delays on any CPU;
                                               # an abort or shutdown ends the sleep early. 0: no sleep

    def __post_init__(self) -> None:
        if not isinstance(self.device, str) or not (self.device in DEVICES or re.fullmatch(r"cuda:\d+", self.device)):
            raise ValueError(f"device: expected one of {DEVICES} or 'cuda:N', got {self.device!r}")
        check_int("cpu_threads", self.cpu_threads, lo=0, hi=1024)
        check_bool("fast_decode", self.fast_decode)
        si = self.python_switch_interval_ms
        lo, hi = SWITCH_INTERVAL_MS
        if not is_number(si) or not (si == 0 or lo <= si <= hi):
            raise ValueError(f"python_switch_interval_ms: expected 0 (leave Python's) or a number in [{lo}, {hi}], "
                             f"got {si!r}")
        d = self.test_step_delay_s
        if not is_number(d) or not 0 <= d <= 10:
            raise ValueError(f"test_step_delay_s: expected seconds in [0, 10] (a setting for tests only), got {d!r}")
