"""Assemble an engine's parts from an ``EngineConfig``: device, dtype, model, KV cache, backends."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from backend.attention.selector import make_attention_backend
from backend.attention.window import serving_windows, uniform_window
from backend.config import EngineConfig
from backend.core.kv_cache import KVCache
from backend.core.kv_quant import check_kv_format_device, kv_format
from backend.core.scheduler import Scheduler
from backend.engine.kv_budget import num_kv_blocks
from backend.engine.model_runner import ModelRunner
from backend.lora.runtime import LoraRuntime
from backend.model.config import ModelConfig
from backend.model.fused import fused_ops
from backend.model.llama import LlamaForCausalLM
from backend.model.loader import load_model
from backend.model.quant import quantize_model
from backend.sampling.bitmask_kernels import TORCH_KERNELS, BitmaskKernels
from backend.sampling.keyed_draw import DrawKernels, DrawRule
from backend.sampling.sampler import Sampler
from backend.spec_decode.ngram import NgramProposer
from backend.spec_decode.speculator import Speculator
from backend.structured_output.manager import StructuredOutputManager


@dataclass(frozen=True)
class ServedFormats:
    """The numeric formats that serve requests: named on the load line, ``/metrics``, each request's log line
    and the gateway's GetModelInfo, so a quality change can be traced to a quantization flag."""

    quantization: str = "none"     # weights: EngineConfig.model.quantization
    kv_cache_dtype: str = "auto"   # KV storage: EngineConfig.cache.kv_cache_dtype
    dtype: str = "float32"         # compute dtype (what ``auto`` KV stores)

    def labels(self) -> dict[str, str]:
        return {"quantization": self.quantization, "kv_cache_dtype": self.kv_cache_dtype, "dtype": self.dtype}


@dataclass
class EngineParts:
    scheduler: Scheduler
    runner: ModelRunner       # holds the model, the KV cache, the attention backend and the sampler
    speculator: Speculator | None = None
    cpu_threads: int = 1      # intra-op threads the engine may use per step on the CPU (1 on CUDA: not its concern)
    summary: str = ""         # the one line logged at load (``load_summary``)
    structured_output: StructuredOutputManager | None = None   # grammar state of guided requests
    lora: LoraRuntime | None = None                             # the LoRA adapters served (None: none)
    formats: ServedFormats = ServedFormats()                    # weight / KV / compute formats serving requests


@dataclass(frozen=True)
class FastDecode:
    step: object | None    # NativeDecodeStep, or None (every step eager)
    reason: str            # why None

    def describe(self) -> str:
        if self.step is None:
            return self.reason
        kind = "CUDA graphs" if type(self.step).__name__ == "CudaGraphDecodeStep" else "native"
        return f"{kind} (ready in {self.step.build_seconds:.1f} s)"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {name!r} requested but CUDA is not available")
    return dev


def resolve_dtype(name: str, device: torch.device, checkpoint_dtype: torch.dtype) -> torch.dtype:
    """``auto``: fp32 on CPU; on CUDA the checkpoint's half dtype (fp32 checkpoints run in bf16)."""
    if name != "auto":
        return getattr(torch, name)
    if device.type == "cpu":
        return torch.float32
    if checkpoint_dtype in (torch.float16, torch.bfloat16):
        return checkpoint_dtype
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def generation_eos_ids(folder: Path) -> set[int]:
    """EOS ids from ``generation_config.json`` (they may differ from ``config.json``'s)."""
    path = folder / "generation_config.json"
    if not path.is_file():
        return set()
    eos = json.loads(path.read_text()).get("eos_token_id")
    return set(eos) if isinstance(eos, list) else ({eos} if isinstance(eos, int) else set())


def checkpoint_identity(folder: Path) -> str:
    """A prefix-cache key: changes whenever the weights' config or the tokenizer change."""
    h = hashlib.sha256()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        p = folder / name
        if p.is_file():
            h.update(name.encode() + p.read_bytes())
    st = folder / "model.safetensors"
    if st.is_file():
        h.update(str(st.stat().st_size).encode() + str(st.stat().st_mtime_ns).encode())
    return h.hexdigest()[:32]


def tensor_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers (its weights, RoPE tables, quantized weights included)."""
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def build_engine_parts(config: EngineConfig) -> EngineParts:
    folder = Path(config.model.model_path)
    device = resolve_device(config.execution.device)
    if device.type == "cpu" and config.execution.cpu_threads:
        # process-wide; on a small shared CPU fewer threads than cores avoids OpenMP barrier stalls
        torch.set_num_threads(config.execution.cpu_threads)
    mcfg = ModelConfig.from_file(folder / "config.json")
    check_composes(config, mcfg)
    dtype = resolve_dtype(config.model.dtype, device, mcfg.dtype)
    check_kv_format_device(kv_format(config.cache.kv_cache_dtype, dtype), device)   # before the weights load
    max_model_len = served_context(config, mcfg)
    model = load_model(folder, dtype=dtype, device=device, max_positions=max_model_len)
    quantize_model(model, config.model.quantization, config.model.quantization_group_size)
    model.fused, fused_text = fused_ops(device, dtype, mcfg.head_dim)   # Triton elementwise kernels on CUDA
    blocks = num_kv_blocks(config, mcfg, device, dtype, weight_bytes=tensor_bytes(model))
    kv_cache = KVCache(mcfg.num_hidden_layers, blocks, config.cache.block_size, mcfg.num_key_value_heads, mcfg.head_dim,
                       dtype=dtype, device=device, kv_cache_dtype=config.cache.kv_cache_dtype)
    eos = set(mcfg.eos_token_ids) | generation_eos_ids(folder)
    windows = serving_windows(mcfg.sliding_windows, mcfg.num_hidden_layers, max_model_len)
    structured = StructuredOutputManager(
        lambda: xgrammar_backend(folder, mcfg.vocab_size, eos, device), vocab_size=mcfg.vocab_size,
        compile_timeout_s=config.structured_output.guided_compile_timeout_s,
        max_workers=config.structured_output.guided_compile_workers, device=device,
        jump_forward=config.structured_output.guided_jump_forward)
    is_ready = structured.compiles.is_ready   # a guided request waits for its grammar; a LoRA one for a slot too
    scheduler = Scheduler(config, num_blocks=blocks, max_model_len=max_model_len, vocab_size=mcfg.vocab_size,
                          eos_token_ids=eos, cache_key=checkpoint_identity(folder),
                          sliding_window=uniform_window(windows),
                          can_admit=is_ready if not config.lora.enabled else   # lora: built below, before any step
                          (lambda seq: lora.admission.can_admit(seq) and is_ready(seq)))
    attn = make_attention_backend(kv_cache, scale=mcfg.query_scale, windows=windows)   # Gemma: its query scale
    fast = build_fast_decode(config, model, kv_cache, windows, max_model_len)
    sampler = Sampler(vocab_size=mcfg.vocab_size, device=device, seed=config.model.seed, eos_token_ids=sorted(eos),
                      bitmask_kernels=native_bitmask_kernels(fast, device), draws=DrawKernels.for_device(device),
                      rule=DrawRule.of(config.speculative.speculative_method, config.speculative.draft_coupling))
    lora = LoraRuntime.build(config, mcfg, device, scheduler, dtype) if config.lora.enabled else None
    runner = ModelRunner(model, kv_cache, attn, sampler, device, fast_decode=fast.step,
                         lora=lora.slots if lora is not None else None)
    speculator = build_speculator(config, folder, mcfg, blocks, device, dtype, max_model_len, grammar=structured)
    summary = load_summary(config, mcfg, model, kv_cache, device, dtype, max_model_len, windows,
                           type(attn).__name__, speculator) + f", fused ops {fused_text}, fast decode {fast.describe()}" \
        + (f", LoRA adapters {', '.join(lora.names)} (max_loras {config.lora.max_loras}, max_lora_rank "
           f"{config.lora.max_lora_rank})" if lora is not None else "")
    threads = (config.execution.cpu_threads or torch.get_num_threads()) if device.type == "cpu" else 1
    formats = ServedFormats(config.model.quantization, config.cache.kv_cache_dtype, str(dtype).replace("torch.", ""))
    return EngineParts(scheduler, runner, speculator, cpu_threads=threads, summary=summary,
                       structured_output=structured, formats=formats, lora=lora)


def check_composes(config: EngineConfig, mcfg: ModelConfig) -> None:
    """Refuse, naming the setting, what this model's family does not compose with (``Architecture``)."""
    arch = mcfg.architecture
    if config.lora.enabled and not arch.lora:
        raise ValueError(f"{'lora_adapters' if config.lora.lora_adapters else 'lora_dir'}: LoRA adapters on a "
                         f"{arch.hf_class} checkpoint are not supported")


def served_context(config: EngineConfig, mcfg: ModelConfig) -> int:
    """``max_model_len``: the model's context, or where transformers' own output depends on how generation was
    chunked (LongRoPE past ``original_max_position_embeddings``: ``ModelConfig.exact_positions``) that length."""
    if config.model.max_model_len is not None and mcfg.exact_positions < min(config.model.max_model_len,
                                                                      mcfg.max_position_embeddings):
        raise ValueError(f"max_model_len: {config.model.max_model_len} exceeds {mcfg.exact_positions}, this LongRoPE "
                         "checkpoint's original_max_position_embeddings; past it transformers switches a whole "
                         "forward to the long factors and keeps the keys cached before with the short ones, which "
                         "the engine does not reproduce")
    return config.model.resolve_max_model_len(mcfg.exact_positions)


def load_summary(config: EngineConfig, mcfg: ModelConfig, model: LlamaForCausalLM, kv: KVCache,
                 device: torch.device, dtype: torch.dtype, max_model_len: int, windows: tuple,
                 attention: str, speculator: Speculator | None) -> str:
    """One line with what a capacity plan starts from: checkpoint, device, dtype, KV pool, settings."""
    params = sum(p.numel() for p in model.parameters())
    pool_tokens = kv.num_blocks * kv.block_size
    per_token = kv.nbytes // pool_tokens
    window = uniform_window(windows)
    held = min(max_model_len, window + config.scheduler.max_num_batched_tokens) if window else max_model_len
    held_blocks = -(-held // kv.block_size)
    windows_text = "none" if not any(windows) else (
        f"{window} on every layer (a sequence holds <= {held} tokens of KV)" if window else
        f"{sum(w is not None for w in windows)} of {len(windows)} layers ({sorted({w for w in windows if w})})")
    if speculator is None:
        spec = "off"
    else:
        sc = config.speculative
        spec = (f"{sc.speculative_method} k={sc.num_speculative_tokens}{' adaptive' if sc.speculative_adaptive else ''}"
                + (f" draft={sc.draft_model_path} (draft steps {speculator.proposer.forward.describe()})"
                   if sc.speculative_method == "draft" else ""))
    kv_text = (f"{kv.format.name} (+ an fp16 scale per token and head)" if kv.format.quantized
               else f"auto ({kv.format.label})")
    arch = mcfg.architecture.label
    return (f"llm engine loaded: checkpoint {config.model.model_path} ({arch}, {mcfg.num_hidden_layers} layers, "
            f"{params / 1e6:.2f}M parameters) on {device} in {str(dtype).replace('torch.', '')}; "
            f"weights quantization {config.model.quantization}; KV cache {kv_text}; "
            f"KV pool {kv.num_blocks} blocks x {kv.block_size} = {pool_tokens} tokens "
            f"({kv.nbytes / 2**20:.1f} MiB, {per_token} bytes per token); max_model_len {max_model_len}: "
            f"{kv.num_blocks // held_blocks} sequences at full context; sliding window {windows_text}; "
            f"max_num_seqs {config.scheduler.max_num_seqs}, "
            f"max_num_batched_tokens {config.scheduler.max_num_batched_tokens}, "
            f"prefix caching {'on' if config.cache.enable_prefix_caching else 'off'}, stream_interval "
            f"{config.scheduler.stream_interval}, attention {attention}, speculation {spec}")


def build_fast_decode(config: EngineConfig, model: LlamaForCausalLM, kv_cache: KVCache, windows,
                      max_model_len: int) -> FastDecode:
    """When ``config.execution.fast_decode`` asks for it and it can serve this model: the native decode step on the
    CPU, CUDA graphs (captured here) on CUDA."""
    if not config.execution.fast_decode:
        return FastDecode(None, "off")
    if kv_cache.device.type == "cuda":
        from backend.engine.cuda_graph_decode import CudaGraphDecodeStep
        k = config.speculative.num_speculative_tokens if config.speculative.enabled else 0
        step = CudaGraphDecodeStep.build(model, kv_cache, windows, model.config.query_scale,
                                         config.scheduler.max_num_seqs, max_model_len, k)
    else:
        from backend.engine.native_decode import NativeDecodeStep
        step = NativeDecodeStep.build(model, kv_cache, windows, scale=None)
    return FastDecode(None, f"off ({step})") if isinstance(step, str) else FastDecode(step, "")


def native_bitmask_kernels(fast: FastDecode, device: torch.device) -> BitmaskKernels:
    """The grammar mask's native ops where the native decode step runs (its library is built), else torch's."""
    if fast.step is None or device.type != "cpu":
        return TORCH_KERNELS
    from backend.native import native_ops
    return BitmaskKernels.of(native_ops().ops)


def build_speculator(config: EngineConfig, target_folder: Path, target: ModelConfig, num_blocks: int,
                     device: torch.device, dtype: torch.dtype, max_model_len: int,
                     grammar: StructuredOutputManager | None = None) -> Speculator | None:
    """The proposer the config names, inside the adaptive driver; None when speculation is off."""
    if config.speculative.speculative_method == "none":
        return None
    if config.speculative.speculative_method == "ngram":
        proposer = NgramProposer(config.speculative.ngram_min, config.speculative.ngram_max)
    else:
        from backend.engine.native_decode import NativeDecodeStep
        from backend.spec_decode.draft_model import DraftModelProposer
        proposer = DraftModelProposer.load(Path(config.speculative.draft_model_path), target_folder, target, config,
                                           num_blocks=num_blocks, device=device, dtype=dtype,
                                           max_model_len=max_model_len,
                                           native_step=NativeDecodeStep.build if config.execution.fast_decode else None)
    return Speculator(proposer, config.speculative.num_speculative_tokens, config.speculative.speculative_adaptive,
                      grammar=grammar)


def xgrammar_backend(folder: Path, vocab_size: int, eos_token_ids: set[int], device: torch.device):
    """The grammar layer for this checkpoint; built on the first guided request (on a compile thread).
    Batched bitmask fills use xgrammar's threads (half the cores) on CUDA, one thread on the CPU, whose
    cores the forward uses."""
    from grammar import XGrammarBackend

    return XGrammarBackend.from_folder(folder, vocab_size, sorted(eos_token_ids),
                                       fill_threads="auto" if device.type == "cuda" else 1)
