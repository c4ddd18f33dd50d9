"""The model's architecture, read from an HF ``config.json`` and validated once."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from backend.model.architecture import ARCHITECTURES, Architecture, architecture


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded; the message names the file and the problem."""


# architectures we load, mapped to the family name used internally (declared in architecture.py)
SUPPORTED_ARCHITECTURES = {name: arch.family for name, arch in ARCHITECTURES.items()}
LAYER_TYPES = ("full_attention", "sliding_attention")
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
        )


def read_rope(d: dict, arch: Architecture, head_dim: int, source: str) -> tuple[float, tuple | None, int]:
    """``(rope_theta, rope_scaling items or None, rotary dims)`` as the family's config class reads them."""
    # transformers >= 5 writes "rope_parameters" (with rope_theta inside) instead of "rope_scaling"
    rope_scaling = dict(d.get("rope_scaling") or d.get("rope_parameters") or {})
    rope_theta = d.get("rope_theta") or rope_scaling.get("rope_theta") or 10000.0
    prf = rope_scaling.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if prf is None:
        prf = 1.0
    if isinstance(prf, bool) or not isinstance(prf, (int, float)) or not 0 < prf <= 1:
        raise CheckpointError(f"{source}: partial_rotary_factor must be a number in (0, 1], got {prf!r}")
    if prf != 1 and not arch.partial_rotary:
        raise CheckpointError(f"{source}: partial_rotary_factor {prf!r} is not supported by the {arch.family} "
                              "layout (RoPE on the whole head)")
    rotary_dim = int(head_dim * prf)
    if rotary_dim % 2:
        raise CheckpointError(f"{source}: partial_rotary_factor {prf!r} gives an odd rotary dimension {rotary_dim}")
    rtype = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    rtype = dict(arch.rope_aliases).get(rtype, rtype)
    if rtype in (None, "default"):
        return rope_theta, None, rotary_dim
    if rtype not in arch.rope_types:
        raise CheckpointError(f"{source}: unknown rope type {rtype!r} in rope_scaling; supported for "
                              f"{arch.hf_class}: {arch.rope_types}")
    rope_scaling["rope_type"] = rtype
    rope_scaling.pop("type", None)
    if rtype == "longrope":
        check_longrope(d, rope_scaling, rotary_dim, source)
    items = tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                         for k, v in rope_scaling.items() if k not in ("rope_theta", "partial_rotary_factor")))
    return rope_theta, items, rotary_dim


def check_longrope(d: dict, rs: dict, rotary_dim: int, source: str) -> None:
    """LongRoPE's fields, checked; ``original_max_position_embeddings`` resolved into ``rs`` as transformers does
    (the top-level field first: Phi-3's config class has it, 4096 by default)."""
    orig = d.get("original_max_position_embeddings") or rs.get("original_max_position_embeddings") \
        or d.get("max_position_embeddings")
    if isinstance(orig, bool) or not isinstance(orig, int) or orig <= 0:
        raise CheckpointError(f"{source}: original_max_position_embeddings must be a positive integer, got {orig!r}")
    rs["original_max_position_embeddings"] = orig
    for key in ("short_factor", "long_factor"):
        v = rs.get(key)
        if not isinstance(v, list) or len(v) != rotary_dim // 2 or \
                any(isinstance(x, bool) or not isinstance(x, (int, float)) or x <= 0 for x in v):
            raise CheckpointError(f"{source}: rope_scaling {key} must list {rotary_dim // 2} positive numbers "
                                  f"(one per rotated pair), got {v!r}")
    for key in ("factor", "attention_factor"):
        v = rs.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
            raise CheckpointError(f"{source}: rope_scaling {key} must be a positive number, got {v!r}")


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
    - ``none`` (Llama): transformers' Llama has no sliding window (a non-null one is refused at load).
    """
    arch = architecture(family)
    if arch.windows == "every_layer":
        w = _positive_int_or_none(d, "sliding_window", arch.default_window, source)
        return () if w is None else (w,) * num_layers
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
    act = d.get("hidden_act", "silu")
    if act not in arch.activations:
        raise CheckpointError(f"{source}: hidden_act {act!r} is not supported by the {arch.hf_class} layout "
                              f"(the MLP is gated: {' or '.join(arch.activations)})")
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
        if d.get(key) is not None:
            raise CheckpointError(f"{source}: {key} is not supported by the {family} layout")
    if family == "llama" and d.get("sliding_window") is not None:
        raise CheckpointError(f"{source}: sliding_window {d['sliding_window']!r} on a LlamaForCausalLM checkpoint: "
                              "transformers' Llama ignores it; if the model was trained with a window, label it "
                              "MistralForCausalLM, else set sliding_window to null")
