"""``LoraAdapter``: one PEFT adapter's weights, checked against the base model, grouped by our fused projections.

The engine's projections are fused (``qkv_proj`` = q | k | v, ``gate_up_proj`` = gate | up), so an adapter's
parts are kept per (layer, PEFT module) and laid into a fused projection's stack by ``StackedLoraWeights``. The
modules an adapter may target are its base family's (``layout.py``: split q/k/v/gate/up, or Phi-3's fused
``qkv_proj`` / ``gate_up_proj``); any other is refused naming the family's. Each
part is ``A [r, in]`` and ``B [out, r]`` with the module's scaling folded into ``B`` (``y += x A^T B^T``).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from backend.lora.adapter_config import LoraAdapterConfig, LoraConfigError, read_adapter_config
from backend.lora.layout import module_key, module_shapes
from backend.model.config import ModelConfig

ADAPTER_FILE = "adapter_model.safetensors"
_KEY = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])"
                  r"(?:\.default)?\.weight$")


@dataclass(frozen=True)
class LoraPart:
    a: torch.Tensor   # [r, in]
    b: torch.Tensor   # [out, r], the scaling folded in


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    config: LoraAdapterConfig
    parts: dict[tuple[int, str], LoraPart]   # (layer, PEFT module) -> its weights
    identity: str                            # digest of the weights: part of the prefix-cache key

    @property
    def max_rank(self) -> int:
        return max(p.a.shape[0] for p in self.parts.values())

    def nbytes(self) -> int:
        return sum(p.a.numel() * 4 + p.b.numel() * 4 for p in self.parts.values())


def load_adapter(folder: str | Path, name: str, cfg: ModelConfig) -> LoraAdapter:
    """Read and check a PEFT adapter folder; ``LoraConfigError`` naming the file or field on any mismatch."""
    folder = Path(folder)
    config = read_adapter_config(folder, name)
    path = folder / ADAPTER_FILE
    where = f"lora adapter {name!r} ({path})"
    if not path.is_file():
        raise LoraConfigError(f"{where}: {ADAPTER_FILE} is missing")
    try:
        tensors = load_file(str(path))
    except Exception as e:   # safetensors raises its own error types for a damaged file
        raise LoraConfigError(f"{where}: cannot read ({e})") from None
    return adapter_from_tensors(name, config, tensors, cfg, where)


def adapter_from_tensors(name: str, config: LoraAdapterConfig, tensors: dict[str, torch.Tensor],
                         cfg: ModelConfig, where: str) -> LoraAdapter:
    """Group ``lora_A`` / ``lora_B`` tensors by (layer, module), checking names, ranks and shapes."""
    shapes = module_shapes(cfg)
    family = cfg.architecture.hf_class
    foreign = sorted(config.target_modules - set(shapes)) if not config.all_linear else []
    if foreign:
        raise LoraConfigError(f"{where}: target_modules {foreign} are not projections of the {family} base "
                              f"(its PEFT targets: {', '.join(shapes)})")
    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise LoraConfigError(f"{where}: tensor {key!r}: not a LoRA weight of a decoder projection "
                                  f"(embedding / LM-head LoRA and saved modules are not supported)")
        layer, module, ab = int(m.group(1)), m.group(3), m.group(4)
        if module not in shapes:
            raise LoraConfigError(f"{where}: tensor {key!r}: {module!r} is not a projection of the {family} base "
                                  f"(its PEFT targets: {', '.join(shapes)})")
        if module not in config.target_modules:
            raise LoraConfigError(f"{where}: tensor {key!r}: module {module!r} is not in target_modules "
                                  f"{sorted(config.target_modules)}")
        if layer >= cfg.num_hidden_layers or not config.transforms_layer(layer):
            raise LoraConfigError(f"{where}: tensor {key!r}: layer {layer} is outside the base model's "
                                  f"{cfg.num_hidden_layers} layers or layers_to_transform")
        found.setdefault((layer, module), {})[ab] = t
    if not found:
        raise LoraConfigError(f"{where}: no lora_A / lora_B tensors")
    parts = {}
    digest = hashlib.sha256(name.encode())
    for (layer, module), ab in sorted(found.items()):
        if set(ab) != {"A", "B"}:
            raise LoraConfigError(f"{where}: layer {layer} {module}: lora_{'B' if 'A' in ab else 'A'} is missing")
        out, inp = shapes[module]
        r = config.module_rank(module_key(layer, module))
        a, b = ab["A"], ab["B"]
        if tuple(a.shape) != (r, inp) or tuple(b.shape) != (out, r):
            raise LoraConfigError(
                f"{where}: layer {layer} {module}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do not match "
                f"r={r} and the base model's {module} ({out} x {inp}): expected ({r}, {inp}) / ({out}, {r})")
        a, b = a.float().contiguous(), b.float()
        scaled = (b * config.module_scaling(module_key(layer, module))).contiguous()
        parts[(layer, module)] = LoraPart(a, scaled)
        digest.update(a.numpy().tobytes() + scaled.numpy().tobytes())
    return LoraAdapter(name, config, parts, digest.hexdigest()[:32])
