"""The model's architecture, read from an HF ``config.json`` and validated once."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded; the message names the file and the problem."""


# architectures we load, mapped to the family name used internally
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
SUPPORTED_ACTIVATIONS = ("silu", "swish")   # SwiGLU (transformers' ACT2FN: the same function)
LAYER_TYPES = ("full_attention", "sliding_attention")
MISTRAL_DEFAULT_SLIDING_WINDOW = 4096       # MistralConfig's default when config.json has no such key
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ModelConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: tuple | None  # sorted (key, value) items of the HF rope_scaling dict
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    torch_dtype: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    # per layer: the sliding window (keys p - W < k <= p) or None; () when no layer has one
    sliding_windows: tuple = ()

    @property
    def rope_scaling_dict(self) -> dict | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    @property
    def rope_type(self) -> str:
        d = self.rope_scaling_dict
        if not d:
            return "default"
        return d.get("rope_type", d.get("type", "default"))

    @property
    def dtype(self) -> torch.dtype:
        return _DTYPES[self.torch_dtype]

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"{path}: missing file (every checkpoint needs config.json)")
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: not valid JSON ({e})") from e
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, d: dict, source: str = "config.json") -> "ModelConfig":
        archs = d.get("architectures") or []
        family = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if family is None:
            raise CheckpointError(
                f"{source}: unsupported architectures {archs!r}; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if not isinstance(d.get(key), int) or d[key] <= 0:
                raise CheckpointError(f"{source}: field {key!r} must be a positive integer, got {d.get(key)!r}")
        heads = d["num_attention_heads"]
        kv_heads = d.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise CheckpointError(f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
        head_dim = d.get("head_dim") or d["hidden_size"] // heads
        # transformers >= 5 writes "rope_parameters" (with rope_theta inside) instead of "rope_scaling"
        rope_scaling = d.get("rope_scaling") or d.get("rope_parameters")
        rope_theta = d.get("rope_theta") or (rope_scaling or {}).get("rope_theta") or 10000.0
        if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) in (None, "default"):
            rope_scaling = None
        if rope_scaling:
            rtype = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
            if rtype not in SUPPORTED_ROPE_TYPES:
                raise CheckpointError(f"{source}: unknown rope type {rtype!r} in rope_scaling; supported: {SUPPORTED_ROPE_TYPES}")
            rope_scaling = tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                        for k, v in rope_scaling.items() if k != "rope_theta"))
        check_supported_fields(d, family, source)
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        dtype = d.get("torch_dtype") or d.get("dtype") or "float32"
        if dtype not in _DTYPES:
            raise CheckpointError(f"{source}: unsupported torch_dtype {dtype!r}")
        return cls(
            family=family,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            # as transformers: only Llama reads these two; Qwen2 always has q/k/v biases, Mistral none
            attention_bias=bool(d.get("attention_bias", False)) if family == "llama" else family == "qwen2",
            mlp_bias=bool(d.get("mlp_bias", False)) if family == "llama" else False,
            torch_dtype=dtype,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            sliding_windows=sliding_windows(d, family, d["num_hidden_layers"], source),
        )


def _positive_int_or_none(d: dict, key: str, default, source: str):
    v = d.get(key, default)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
        raise CheckpointError(f"{source}: field {key!r} must be a positive integer or null, got {v!r}")
    return v


def sliding_windows(d: dict, family: str, num_layers: int, source: str = "config.json") -> tuple:
    """Per-layer sliding windows exactly as transformers reads them (``()`` when no layer has one).

    - Mistral: ``sliding_window`` on every layer (absent: 4096, MistralConfig's default; null: none).
    - Qwen2: only with ``use_sliding_window``; then the layers whose ``layer_types`` entry is
      ``sliding_attention`` (default: those from ``max_window_layers`` on, 28 when absent).
    - Llama: transformers' Llama has no sliding window (a non-null one is refused at load).
    """
    if family == "mistral":
        w = _positive_int_or_none(d, "sliding_window", MISTRAL_DEFAULT_SLIDING_WINDOW, source)
        return () if w is None else (w,) * num_layers
    if family != "qwen2" or not d.get("use_sliding_window", False):
        return ()
    w = _positive_int_or_none(d, "sliding_window", 4096, source)
    if w is None:
        return ()
    types = d.get("layer_types")
    if types is None:
        first = d.get("max_window_layers", 28)
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise CheckpointError(f"{source}: field 'max_window_layers' must be a non-negative integer, got {first!r}")
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    if not isinstance(types, list) or len(types) != num_layers or any(t not in LAYER_TYPES for t in types):
        raise CheckpointError(f"{source}: field 'layer_types' must list one of {LAYER_TYPES} per layer "
                              f"({num_layers}), got {types!r}")
    windows = tuple(w if t == "sliding_attention" else None for t in types)
    return windows if any(x is not None for x in windows) else ()


def check_supported_fields(d: dict, family: str, source: str = "config.json") -> None:
    """Refuse a config whose fields change the maths in ways this engine does not implement.

    The fields transformers' Llama / Mistral / Qwen2 read (and what we do with each) are listed in
    docs/engine.md, "Checkpoint fields"; the ones refused here would otherwise be silently ignored.
    """
    act = d.get("hidden_act", "silu")
    if act not in SUPPORTED_ACTIVATIONS:
        raise CheckpointError(f"{source}: hidden_act {act!r} is not supported (the MLP is SwiGLU: "
                              f"{' or '.join(SUPPORTED_ACTIVATIONS)})")
    if family == "llama" and d.get("attention_bias"):
        raise CheckpointError(f"{source}: attention_bias true (Llama's biases on q/k/v and o_proj) is not "
                              "supported; q/k/v biases are supported in the Qwen2 layout")
    if d.get("quantization_config"):
        method = (d["quantization_config"] or {}).get("quant_method", "?") \
            if isinstance(d["quantization_config"], dict) else "?"
        if method not in ("gptq", "awq"):   # read (and their settings checked) by backend/model/gptq.py, awq.py
            raise CheckpointError(f"{source}: quantized checkpoints other than GPTQ and AWQ are not supported "
                                  f"(quantization_config, quant_method {method!r}); use a float16 / bfloat16 / "
                                  "float32 checkpoint")
    for where in (d, d.get("rope_scaling") or {}, d.get("rope_parameters") or {}):
        prf = where.get("partial_rotary_factor", 1.0) if isinstance(where, dict) else 1.0
        if prf not in (None, 1, 1.0):
            raise CheckpointError(f"{source}: partial_rotary_factor {prf!r} is not supported (RoPE on the whole head)")
    # fields transformers' class for this architecture ignores, but that change the maths if meant
    # (a mislabelled checkpoint): refused rather than guessed
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "logit_softcapping"):
        if d.get(key) is not None:
            raise CheckpointError(f"{source}: {key} is not supported by the {family} layout")
    if family == "llama" and d.get("sliding_window") is not None:
        raise CheckpointError(f"{source}: sliding_window {d['sliding_window']!r} on a LlamaForCausalLM checkpoint: "
                              "transformers' Llama ignores it; if the model was trained with a window, label it "
                              "MistralForCausalLM, else set sliding_window to null")
