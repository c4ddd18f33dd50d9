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
            attention_bias=bool(d.get("attention_bias", family == "qwen2")),
            mlp_bias=bool(d.get("mlp_bias", False)),
            torch_dtype=dtype,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )
