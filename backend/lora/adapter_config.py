"""``LoraAdapterConfig``: a PEFT ``adapter_config.json`` read once, every field either honoured or refused by name.

Honoured: ``r``, ``lora_alpha``, ``use_rslora`` (scaling ``alpha / sqrt(r)`` instead of ``alpha / r``),
``target_modules`` (a list among the decoder's projections, split or fused as the base family's checkpoint
stores them, or ``all-linear``), ``rank_pattern`` / ``alpha_pattern``
(PEFT's key match: ``(.*\\.)?KEY$`` against the module's name, the first key that matches wins),
``layers_to_transform`` / ``layers_pattern`` (the layers given, by their ``layers`` index). Fields that only shape
training (dropout, initialisation schemes) do not change inference and are read past. Everything else is refused
with ``LoraConfigError`` naming the field when it is set: DoRA, ``modules_to_save``, embedding or LM-head
targets, a bias, ``fan_in_fan_out``, regex targets, and any field this module does not know.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

# PEFT's names of the decoder projections of every family: split (Llama, Qwen) or fused (Phi-3); which ones a
# base has is checked when the adapter loads against it (adapter.py, layout.py)
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "gate_proj", "up_proj", "gate_up_proj",
                  "down_proj")

# fields that do not change what inference computes (dropout, training-time initialisation, bookkeeping)
_READ_PAST = frozenset({
    "task_type", "auto_mapping", "peft_version", "base_model_name_or_path", "revision", "inference_mode",
    "lora_dropout", "init_lora_weights", "loftq_config", "eva_config", "corda_config", "lora_ga_config",
    "megatron_core", "qalora_group_size", "ensure_weight_tying"})
_HONOURED = frozenset({"peft_type", "r", "lora_alpha", "use_rslora", "target_modules", "rank_pattern",
                       "alpha_pattern", "layers_to_transform", "layers_pattern", "bias"})
# refused when set, with why
_REFUSED = {
    "use_dora": "DoRA (weight-decomposed LoRA) is not implemented",
    "modules_to_save": "fully trained modules beside the adapter are not implemented",
    "fan_in_fan_out": "transposed (Conv1D-style) weights are not implemented",
    "lora_bias": "a LoRA bias is not implemented",
    "exclude_modules": "module exclusion is not implemented",
    "trainable_token_indices": "trainable embedding tokens are not implemented",
    "layer_replication": "layer replication is not implemented",
    "megatron_config": "Megatron-parallel layers are not implemented",
    "use_qalora": "QA-LoRA is not implemented", "use_bdlora": "BD-LoRA is not implemented",
    "target_parameters": "LoRA on raw parameters is not implemented",
    "alora_invocation_tokens": "activated LoRA is not implemented",
    "velora_config": "VeLoRA is not implemented", "monteclora_config": "MonteCLoRA is not implemented",
    "arrow_config": "Arrow routing is not implemented", "kasa_config": "KaSA is not implemented",
}


class LoraConfigError(ValueError):
    """An adapter that cannot be served; the message names the adapter, the file and the field."""


@dataclass(frozen=True)
class LoraAdapterConfig:
    r: int
    lora_alpha: float
    use_rslora: bool
    target_modules: frozenset[str]                   # among TARGET_MODULES
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)
    layers_to_transform: tuple[int, ...] | None = None   # None: every layer
    all_linear: bool = False                         # ``all-linear``: every projection of the base family

    def module_rank(self, module_key: str) -> int:
        """The rank PEFT gives module ``model.layers.{i}.{self_attn|mlp}.{name}``."""
        return self.rank_pattern.get(_pattern_key(self.rank_pattern, module_key), self.r)

    def module_scaling(self, module_key: str) -> float:
        """``alpha / r`` (``alpha / sqrt(r)`` with rsLoRA), with the module's pattern-matched rank and alpha."""
        r = self.module_rank(module_key)
        alpha = self.alpha_pattern.get(_pattern_key(self.alpha_pattern, module_key), self.lora_alpha)
        return alpha / math.sqrt(r) if self.use_rslora else alpha / r

    def transforms_layer(self, layer: int) -> bool:
        return self.layers_to_transform is None or layer in self.layers_to_transform


def _pattern_key(patterns: dict, key: str) -> str:
    """PEFT's ``get_pattern_key``: the first pattern ``P`` with ``(.*\\.)?P$`` matching the module's name."""
    return next((p for p in patterns if re.match(rf"(.*\.)?({p})$", key)), key)


def read_adapter_config(folder: Path, name: str) -> LoraAdapterConfig:
    """Parse ``folder/adapter_config.json``; ``LoraConfigError`` naming the field for whatever is refused."""
    path = folder / "adapter_config.json"
    where = f"lora adapter {name!r} ({path})"
    if not path.is_file():
        raise LoraConfigError(f"{where}: adapter_config.json is missing")
    try:
        raw = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise LoraConfigError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise LoraConfigError(f"{where}: expected a JSON object")
    return parse_adapter_config(raw, where)


def parse_adapter_config(raw: dict, where: str) -> LoraAdapterConfig:
    def fail(key: str, why: str) -> LoraConfigError:
        return LoraConfigError(f"{where}: {key}: {why}")

    for key, value in raw.items():
        if key in _READ_PAST or key in _HONOURED:
            continue
        if key in _REFUSED:
            if value not in (None, False, [], {}, ""):
                raise fail(key, f"{_REFUSED[key]} (got {value!r})")
            continue
        if value not in (None, False, [], {}, ""):
            raise fail(key, f"unknown adapter field set to {value!r}; not supported")
    if raw.get("peft_type", "LORA") != "LORA":
        raise fail("peft_type", f"only LORA adapters are served, got {raw.get('peft_type')!r}")
    if raw.get("bias", "none") != "none":
        raise fail("bias", f"only 'none' is supported, got {raw.get('bias')!r}")
    r = raw.get("r", 8)
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise fail("r", f"expected a positive integer, got {r!r}")
    alpha = raw.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise fail("lora_alpha", f"expected a number, got {alpha!r}")
    rslora = raw.get("use_rslora", False)
    if not isinstance(rslora, bool):
        raise fail("use_rslora", f"expected a boolean, got {rslora!r}")
    targets = _targets(raw.get("target_modules"), fail)
    ranks = _pattern(raw.get("rank_pattern") or {}, "rank_pattern", int, fail)
    alphas = _pattern(raw.get("alpha_pattern") or {}, "alpha_pattern", (int, float), fail)
    layers = raw.get("layers_to_transform")
    if isinstance(layers, int) and not isinstance(layers, bool):
        layers = [layers]
    if layers is not None and (not isinstance(layers, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers)):
        raise fail("layers_to_transform", f"expected a layer index or a list of them, got {layers!r}")
    pattern = raw.get("layers_pattern")
    if pattern not in (None, "layers", ["layers"]):
        raise fail("layers_pattern", f"only the decoder's 'layers' is supported, got {pattern!r}")
    return LoraAdapterConfig(r, float(alpha), rslora, targets, ranks, {k: float(v) for k, v in alphas.items()},
                             tuple(layers) if layers is not None else None, raw.get("target_modules") == "all-linear")


def _targets(value, fail) -> frozenset[str]:
    if value == "all-linear":
        return frozenset(TARGET_MODULES)
    if isinstance(value, str):
        raise fail("target_modules", f"a regex ({value!r}) is not supported; list the projections "
                                     f"({', '.join(TARGET_MODULES)}) or use 'all-linear'")
    if not isinstance(value, list) or not value:
        raise fail("target_modules", f"expected a non-empty list of projection names, got {value!r}")
    names = []
    for v in value:
        short = v.rsplit(".", 1)[-1] if isinstance(v, str) else v
        if short not in TARGET_MODULES:
            raise fail("target_modules", f"{v!r} is not supported (embedding and LM-head LoRA are not "
                                         f"implemented); expected among {', '.join(TARGET_MODULES)}")
        names.append(short)
    return frozenset(names)


def _pattern(value, key: str, kind, fail) -> dict:
    if not isinstance(value, dict):
        raise fail(key, f"expected an object of module pattern -> value, got {value!r}")
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, kind) or v <= 0:
            raise fail(key, f"{k!r}: expected a positive number, got {v!r}")
    return dict(value)
