"""The model's architecture, read from an HF ``config.json`` and validated once."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from backend.model.architecture import ACTIVATIONS, ARCHITECTURES, LAYER_TYPES, Architecture, architecture
from backend.model.checkpoint_error import CheckpointError
from backend.model.rope_fields import read_layer_type_ropes, read_rope

__all__ = ["CheckpointError", "ModelConfig", "SUPPORTED_ARCHITECTURES", "check_supported_fields", "sliding_windows"]


# architectures we load, mapped to the family name used internally (declared in architecture.py)
SUPPORTED_ARCHITECTURES = {name: arch.family for name, arch in ARCHITECTURES.items()}
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
    attention_bias: bool        # biases on q, k and v
    mlp_bias: bool
    torch_dtype: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    # per layer: the sliding window (keys p - W < k <= p) or None; () when no layer has one
    sliding_windows: tuple = ()
    o_proj_bias: bool = False   # a bias on o_proj (Llama / Qwen3 with attention_bias)
    rotary_dim: int = 0         # the leading dims of each head RoPE rotates (partial_rotary_factor); 0: head_dim
    # the sliding layers' own RoPE (Gemma 3: rope_local_base_freq, rope_parameters["sliding_attention"]); None: the
    # same tables as the other layers
    local_rope_theta: float | None = None
    local_rope_scaling: tuple | None = None
    query_scale: float | None = None              # attention scale (Gemma 3: query_pre_attn_scalar**-0.5); None:
                                                  # head_dim**-0.5
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)
    activation: str = "silu"                      # the MLP's op (architecture.ACTIVATIONS): silu, gelu_tanh

    @property
    def architecture(self) -> Architecture:
        return architecture(self.family)

    @property
    def rope_dim(self) -> int:
        return self.rotary_dim or self.head_dim

    @property
    def rope_scaling_dict(self) -> dict | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    @property
    def layer_rope(self) -> tuple[int, ...]:
        """Per layer, which RoPE table it uses: 0 the model's, 1 the sliding layers' own (``local_rope_theta``)."""
        local = self.local_rope_theta is not None
        return tuple(int(local and bool(self.sliding_windows) and w is not None)
                     for w in (self.sliding_windows or (None,) * self.num_hidden_layers))

    @property
    def embed_scale(self) -> float | None:
        """What the embeddings are multiplied by (Gemma: sqrt(hidden_size)); None: nothing."""
        return self.hidden_size ** 0.5 if self.architecture.embed_scale else None

    @property
    def rope_type(self) -> str:
        d = self.rope_scaling_dict
        if not d:
            return "default"
        return d.get("rope_type", d.get("type", "default"))

    @property
    def exact_positions(self) -> int:
        """The longest sequence served as transformers computes it. LongRoPE: transformers switches every position of
        a forward to the long factors once it reaches past ``original_max_position_embeddings``, keeping the keys
        cached before with the short ones, so the output depends on how generation was chunked; up to that length
        the short factors hold throughout, and that is what the engine serves."""
        if self.rope_type == "longrope":
            return min(self.max_position_embeddings, int(self.rope_scaling_dict["original_max_position_embeddings"]))
        return self.max_position_embeddings

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
        arch = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
        if arch is None:
            raise CheckpointError(
                f"{source}: unsupported architectures {archs!r}; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        family = arch.family
        d = arch.with_defaults(d)
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if not isinstance(d.get(key), int) or d[key] <= 0:
                raise CheckpointError(f"{source}: field {key!r} must be a positive integer, got {d.get(key)!r}")
        heads = d["num_attention_heads"]
        kv_heads = d.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise CheckpointError(f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
        head_dim = d.get("head_dim") or d["hidden_size"] // heads
        local_rope = None
        if arch.local_rope:
            (rope_theta, rope_scaling, rotary_dim), local_rope = read_layer_type_ropes(d, arch, head_dim, source)
        else:
            rope_theta, rope_scaling, rotary_dim = read_rope(d, arch, head_dim, source)
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
            # as transformers: each family reads attention_bias / mlp_bias, or has fixed biases (architecture.py)
            attention_bias=arch.has_bias(arch.qkv_bias, d),
            mlp_bias=arch.has_bias(arch.mlp_bias, d),
            torch_dtype=dtype,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            sliding_windows=sliding_windows(d, family, d["num_hidden_layers"], source),
            o_proj_bias=arch.has_bias(arch.o_bias, d),
            rotary_dim=rotary_dim if rotary_dim != head_dim else 0,
            local_rope_theta=None if local_rope is None else float(local_rope[0]),
            local_rope_scaling=None if local_rope is None else local_rope[1],
            query_scale=read_query_scale(d, arch, source),
            final_logit_softcapping=read_softcap(d, "final_logit_softcapping", arch, source),
            activation=ACTIVATIONS[d.get(arch.activation_field, arch.activations[0])],
        )


def read_query_scale(d: dict, arch: Architecture, source: str) -> float | None:
    """The attention scale: ``arch.query_scale_field ** -0.5`` (Gemma's query_pre_attn_scalar), else None."""
    if arch.query_scale_field is None:
        return None
    v = d.get(arch.query_scale_field)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise CheckpointError(f"{source}: field {arch.query_scale_field!r} must be a positive number, got {v!r}")
    return float(v) ** -0.5


def read_softcap(d: dict, key: str, arch: Architecture, source: str) -> float | None:
    """A logit soft-capping field the family implements (``arch.softcaps``): its cap, or None when null / absent."""
    v = d.get(key)
    if v is None or key not in arch.softcaps:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise CheckpointError(f"{source}: field {key!r} must be a positive number or null, got {v!r}")
    return float(v)


def _positive_int_or_none(d: dict, key: str, default, source: str):
    v = d.get(key, default)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
        raise CheckpointError(f"{source}: field {key!r} must be a positive integer or null, got {v!r}")
    return v


def sliding_windows(d: dict, family: str, num_layers: int, source: str = "config.json") -> tuple:
    """Per-layer sliding windows exactly as transformers reads them (``()`` when no layer has one), by the
    family's rule (``Architecture.windows``):

    - ``every_layer`` (Mistral, Phi-3): ``sliding_window`` on every layer (absent: the config class's default,
      Mistral's 4096, Phi-3's none; null: none).
    - ``use_sliding_window`` (Qwen2, Qwen3): only with ``use_sliding_window``; then the layers whose ``layer_types``
      entry is ``sliding_attention`` (default: those from ``max_window_layers`` on, 28 when absent).
    - ``layer_types`` (Gemma 3): the layers whose ``layer_types`` entry is ``sliding_attention`` (default: every
      layer but each ``sliding_window_pattern``-th, 6 when absent), each with ``sliding_window`` (4096 when absent).
    - ``none`` (Llama): transformers' Llama has no sliding window (a non-null one is refused at load).
    """
    arch = architecture(family)
    if arch.windows == "every_layer":
        w = _positive_int_or_none(d, "sliding_window", arch.default_window, source)
        return () if w is None else (w,) * num_layers
    if arch.windows == "layer_types":
        pattern = d.get("sliding_window_pattern", 6)
        if d.get("layer_types") is None and (isinstance(pattern, bool) or not isinstance(pattern, int) or pattern <= 0):
            raise CheckpointError(f"{source}: field 'sliding_window_pattern' must be a positive integer, got {pattern!r}")
        types = d.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                         for i in range(num_layers)]
        w = _positive_int_or_none(d, "sliding_window", arch.default_window, source)
        if w is None and "sliding_attention" in (types if isinstance(types, list) else []):
            raise CheckpointError(f"{source}: field 'sliding_window' is null but layer_types has sliding_attention "
                                  "layers")
        return _windows_of_types(types, w, num_layers, source)
    if arch.windows != "use_sliding_window" or not d.get("use_sliding_window", False):
        return ()
    w = _positive_int_or_none(d, "sliding_window", arch.default_window, source)
    if w is None:
        return ()
    types = d.get("layer_types")
    if types is None:
        first = d.get("max_window_layers", 28)
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise CheckpointError(f"{source}: field 'max_window_layers' must be a non-negative integer, got {first!r}")
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    return _windows_of_types(types, w, num_layers, source)


def _windows_of_types(types, w: int | None, num_layers: int, source: str) -> tuple:
    if not isinstance(types, list) or len(types) != num_layers or any(t not in LAYER_TYPES for t in types):
        raise CheckpointError(f"{source}: field 'layer_types' must list one of {LAYER_TYPES} per layer "
                              f"({num_layers}), got {types!r}")
    windows = tuple(w if t == "sliding_attention" else None for t in types)
    return windows if any(x is not None for x in windows) else ()


def check_supported_fields(d: dict, family: str, source: str = "config.json") -> None:
    """Refuse a config whose fields change the maths in ways this engine does not implement.

    The fields transformers' classes of the families read (and what we do with each) are listed in
    docs/engine.md, "Checkpoint fields"; the ones refused here would otherwise be silently ignored
    (RoPE's are checked by ``read_rope``).
    """
    arch = architecture(family)
    act = d.get(arch.activation_field, arch.activations[0])
    if act not in arch.activations:
        raise CheckpointError(f"{source}: {arch.activation_field} {act!r} is not supported by the {arch.hf_class} "
                              f"layout (the MLP is gated: {' or '.join(arch.activations)})")
    if d.get("quantization_config"):
        method = (d["quantization_config"] or {}).get("quant_method", "?") \
            if isinstance(d["quantization_config"], dict) else "?"
        if method not in ("gptq", "awq"):   # read (and their settings checked) by backend/model/gptq.py, awq.py
            raise CheckpointError(f"{source}: quantized checkpoints other than GPTQ and AWQ are not supported "
                                  f"(quantization_config, quant_method {method!r}); use a float16 / bfloat16 / "
                                  "float32 checkpoint")
        if not arch.prequantized:
            raise CheckpointError(f"{source}: quantization_config ({method}) on a {arch.hf_class} checkpoint is not "
                                  "supported (its fused projections); load a float checkpoint and set quantization")
    # fields transformers' class for this architecture ignores, but that change the maths if meant
    # (a mislabelled checkpoint): refused rather than guessed
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "logit_softcapping"):
        if d.get(key) is not None and key not in arch.softcaps:
            why = " (transformers' Gemma3 does not apply it either; Gemma 3 checkpoints set it to null)" \
                if family == "gemma3" and key == "attn_logit_softcapping" else ""
            raise CheckpointError(f"{source}: {key} {d[key]!r} is not supported by the {family} layout{why}")
    if d.get("use_bidirectional_attention"):
        raise CheckpointError(f"{source}: use_bidirectional_attention is not supported (the engine's attention is "
                              "causal)")
    if family == "llama" and d.get("sliding_window") is not None:
        raise CheckpointError(f"{source}: sliding_window {d['sliding_window']!r} on a LlamaForCausalLM checkpoint: "
                              "transformers' Llama ignores it; if the model was trained with a window, label it "
                              "MistralForCausalLM, else set sliding_window to null")
