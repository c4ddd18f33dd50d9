"""Load (and save) checkpoints of the declared families (``architecture.py``) in the HF folder format.

A folder holds ``config.json``, one ``model.safetensors`` or several shards named
in ``model.safetensors.index.json``, ``tokenizer.json``, ``tokenizer_config.json``
and optionally ``generation_config.json``. Every failure is a ``CheckpointError``
naming the file and the problem.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from backend.model.awq import read_awq_config
from backend.model.config import CheckpointError, ModelConfig
from backend.model.gptq import read_gptq_config
from backend.model.prequantized import PrequantizedConfig
from backend.model.llama import LlamaForCausalLM
from backend.model.quant import QuantizedWeight, QuantLinear, native_ops_for

_LAYER = "model.layers.{i}."


def hf_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every HF tensor name the config implies, with its expected shape (names from the family's declaration)."""
    arch = cfg.architecture
    h, hd = cfg.hidden_size, cfg.head_dim
    q, kv, inter = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd, cfg.intermediate_size
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_hidden_layers):
        p = _LAYER.format(i=i)
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.o_proj.weight": (h, q), p + "mlp.down_proj.weight": (h, inter)})
        for name, rows in arch.qkv_rows(q, kv):
            shapes[p + name + ".weight"] = (rows, h)
            if cfg.attention_bias:
                shapes[p + name + ".bias"] = (rows,)
        for name, rows in arch.gate_up_rows(inter):
            shapes[p + name + ".weight"] = (rows, h)
            if cfg.mlp_bias:
                shapes[p + name + ".bias"] = (rows,)
        if cfg.o_proj_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        if cfg.mlp_bias:
            shapes[p + "mlp.down_proj.bias"] = (h,)
        if arch.qk_norm:
            shapes.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
        if arch.layer_norms == "sandwich":
            shapes.update({p + "pre_feedforward_layernorm.weight": (h,), p + "post_feedforward_layernorm.weight": (h,)})
    return shapes


def _safetensor_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from e
        files = sorted({folder / f for f in weight_map.values()})
        for f in files:
            if not f.is_file():
                raise CheckpointError(f"{f}: missing file (named in {index.name})")
        return files
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    raise CheckpointError(f"{folder}: missing file model.safetensors (or model.safetensors.index.json)")


def read_hf_tensors(folder: Path, cfg: ModelConfig, expected: dict[str, tuple[int, ...]] | None = None,
                    optional: frozenset[str] | set[str] = frozenset()) -> dict[str, torch.Tensor]:
    """Read and shape-check every tensor the config needs (``expected``: default ``hf_tensor_shapes``;
    ``optional`` names may be absent); extra tensors (rotary caches) are ignored."""
    expected = expected or hf_tensor_shapes(cfg)
    tensors: dict[str, torch.Tensor] = {}
    where: dict[str, Path] = {}
    for f in _safetensor_files(folder):
        try:
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():
                    if name in expected:
                        tensors[name] = st.get_tensor(name)
                        where[name] = f
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{f}: unreadable safetensors file ({e})") from e
    for name, shape in expected.items():
        if name not in tensors:
            if name in optional:
                continue
            raise CheckpointError(f"{folder}: missing tensor {name!r}")
        if tuple(tensors[name].shape) != shape:
            raise CheckpointError(
                f"{where[name]}: tensor {name!r} has shape {tuple(tensors[name].shape)}, expected {shape}")
    return tensors


# our per-layer tensors that keep their checkpoint name (under ``model.layers.{i}.``), when the config has them
_SAME_NAMES = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight",
               "self_attn.o_proj.bias", "mlp.down_proj.weight", "mlp.down_proj.bias", "self_attn.q_norm.weight",
               "self_attn.k_norm.weight", "pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight")


def _fused(cfg: ModelConfig) -> tuple[tuple[str, tuple[tuple[str, int], ...], bool], ...]:
    """(our fused projection, the checkpoint's parts with their rows, biased) of one layer."""
    arch, hd = cfg.architecture, cfg.head_dim
    return (("self_attn.qkv_proj", arch.qkv_rows(cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd),
             cfg.attention_bias),
            ("mlp.gate_up_proj", arch.gate_up_rows(cfg.intermediate_size), cfg.mlp_bias))


def hf_to_internal(cfg: ModelConfig, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF names → our fused layout (qkv_proj, gate_up_proj)."""
    out = {"embed_tokens.weight": hf["model.embed_tokens.weight"], "norm.weight": hf["model.norm.weight"]}
    out["lm_head.weight"] = hf["model.embed_tokens.weight"] if cfg.tie_word_embeddings else hf["lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        p, o = _LAYER.format(i=i), f"layers.{i}."
        out.update({o + n: hf[p + n] for n in _SAME_NAMES if p + n in hf})
        for ours, parts, biased in _fused(cfg):
            out[o + ours + ".weight"] = torch.cat([hf[p + name + ".weight"] for name, _ in parts], dim=0)
            if biased:
                out[o + ours + ".bias"] = torch.cat([hf[p + name + ".bias"] for name, _ in parts])
    return out


def internal_to_hf(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our fused layout → HF names (the inverse of ``hf_to_internal``)."""
    out = {"model.embed_tokens.weight": sd["embed_tokens.weight"], "model.norm.weight": sd["norm.weight"]}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        p, o = _LAYER.format(i=i), f"layers.{i}."
        out.update({p + n: sd[o + n] for n in _SAME_NAMES if o + n in sd})
        for ours, parts, biased in _fused(cfg):
            rows = [r for _, r in parts]
            for kind in ("weight", "bias") if biased else ("weight",):
                for (name, _), t in zip(parts, sd[o + ours + "." + kind].split(rows)):
                    out[p + name + "." + kind] = t
    return {k: v.contiguous() for k, v in out.items()}


def tokenizer_vocab_size(folder: Path) -> int:
    """Size of the id space of ``tokenizer.json`` (base vocab plus added tokens)."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{path}: missing file")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e
    ids = list((data.get("model") or {}).get("vocab", {}).values()) + [t["id"] for t in data.get("added_tokens", [])]
    return max(ids) + 1 if ids else 0


def load_model(folder: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu",
               max_positions: int | None = None) -> LlamaForCausalLM:
    """Load an HF-format folder into our model (eval mode, no grad).

    ``dtype`` defaults to fp32 on CPU and to the checkpoint's dtype elsewhere.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: checkpoint folder does not exist")
    cfg = ModelConfig.from_file(folder / "config.json")
    vocab = tokenizer_vocab_size(folder)
    if vocab > cfg.vocab_size:
        raise CheckpointError(
            f"{folder / 'tokenizer.json'}: tokenizer has {vocab} ids but the embedding has {cfg.vocab_size} rows")
    raw = json.loads((folder / "config.json").read_text())
    prequantized: PrequantizedConfig | None = read_awq_config(folder, raw) or read_gptq_config(folder, raw)
    quantized: dict[str, QuantizedWeight] = {}
    if prequantized is None:
        hf = read_hf_tensors(folder, cfg)
    else:  # projections arrive quantized (GPTQ, AWQ): read their tensors, stand meta placeholders in for the float weights
        expected, optional = prequantized.tensor_shapes(hf_tensor_shapes(cfg))
        hf = read_hf_tensors(folder, cfg, expected, optional)
        quantized = prequantized.weights(cfg.num_hidden_layers, hf)
        hf.update({k: torch.empty(v, device="meta") for k, v in hf_tensor_shapes(cfg).items() if k not in hf})
    if dtype is None:
        dtype = torch.float32 if torch.device(device).type == "cpu" else cfg.dtype
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg, max_positions=max_positions)
    model = model.to_empty(device=device)
    state = {k: v.to(dtype) for k, v in hf_to_internal(cfg, hf).items() if not v.is_meta}
    missing, _ = model.load_state_dict(state, strict=not quantized, assign=False)
    if set(missing) != {f"{name}.weight" for name in quantized}:
        raise CheckpointError(f"{folder}: tensors missing for {sorted(set(missing))[:4]}")
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model = model.to(dtype).eval().requires_grad_(False)
    install_quantized(model, quantized, dtype, torch.device(device))
    return model


def install_quantized(model: LlamaForCausalLM, quantized: dict[str, QuantizedWeight], dtype: torch.dtype,
                      device: torch.device) -> None:
    """Replace the named ``nn.Linear`` projections by ``QuantLinear`` layers holding the given weights."""
    workspace: dict = {}
    native = native_ops_for(device) if quantized else None
    for name, qw in quantized.items():
        parent, attr = model.get_submodule(name.rsplit(".", 1)[0]), name.rsplit(".", 1)[1]
        old = getattr(parent, attr)
        qw = QuantizedWeight(qw.mode, qw.qweight.to(device), qw.scale.to(device), qw.group_size,
                             None if qw.zeros is None else qw.zeros.to(device), qw.origin)
        setattr(parent, attr, QuantLinear(qw, old.bias, dtype, workspace, native))


def save_model(model: LlamaForCausalLM, folder: str | Path, config_dict: dict, dtype: torch.dtype = torch.float32) -> None:
    """Write ``model.safetensors`` and ``config.json`` in HF layout (tokenizer files are written separately)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu", dtype) for k, v in model.state_dict().items()}
    save_file(internal_to_hf(model.config, sd), str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config_dict, indent=2) + "\n")
