"""``EngineConfig``: every engine setting, as a frozen composition of frozen sub-configs (backend/config/groups.py),
validated once, built from Triton ``config.pbtxt`` parameters.

Code reads a setting through its group (``config.scheduler.max_num_seqs``, ``config.cache.block_size``).
The parameters stay flat: each ``config.pbtxt`` key (and Helm ``engine`` value) is the name of one field of
one group (``SETTING_GROUPS``), so ``from_parameters``, ``from_settings`` and ``with_settings`` take the
flat names and place each in its group. Every check raises ``ValueError`` naming the field.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

from backend.config.groups import (CacheConfig, ExecutionConfig, LoRAConfig, SchedulerConfig, ServedModelConfig,
                                   SpeculativeConfig, StructuredOutputConfig)
from backend.config.parameters import PARSERS
from contracts.triton_config import TRITON_PARAMETERS, check_known_parameters

# Settings meant for tests only: never for serving, so the Helm chart's engine values leave them out.
TEST_ONLY_PARAMETERS = ("test_step_delay_s",)


@dataclass(frozen=True)
class EngineConfig:
    model: ServedModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    structured_output: StructuredOutputConfig = field(default_factory=StructuredOutputConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if not isinstance(getattr(self, f.name), GROUPS[f.name]):
                raise ValueError(f"{f.name}: expected a {GROUPS[f.name].__name__}, got {getattr(self, f.name)!r}")
        if self.lora.enabled and self.model.quantization != "none":     # the one rule across groups
            raise ValueError(f"lora_adapters: LoRA over a quantized base (quantization={self.model.quantization!r}) "
                             "is not supported")

    @classmethod
    def from_settings(cls, **settings: object) -> "EngineConfig":
        """Build from flat settings named as the ``config.pbtxt`` parameters (``model_path`` required); each
        goes to its group, the others keep their defaults."""
        if "model_path" not in settings:
            raise ValueError("model_path: required engine parameter is missing")
        groups = _by_group(settings)
        model = ServedModelConfig(**groups.pop("model"))
        return cls(model, **{name: GROUPS[name](**values) for name, values in groups.items()})

    def with_settings(self, **settings: object) -> "EngineConfig":
        """A copy with the flat settings given changed (each in its group), validated again."""
        changed = {name: dataclasses.replace(getattr(self, name), **values)
                   for name, values in _by_group(settings).items()}
        return dataclasses.replace(self, **changed)

    @classmethod
    def from_parameters(cls, params: Mapping[str, object]) -> "EngineConfig":
        """Build from Triton ``config.pbtxt`` parameters (keys are the settings' names).

        Values are strings, or Triton's ``{"string_value": "..."}`` dicts. An empty value means
        "use the default"; ``none``/``null`` sets an optional field to None. Every other key is
        refused, naming it (``check_known_parameters``), but Triton's Python backend's own
        (``TRITON_PARAMETERS``); the llm model takes its serving parameters off first.
        """
        check_known_parameters("llm", params, SETTING_GROUPS)
        settings: dict[str, object] = {}
        for key, raw in params.items():
            value = raw.get("string_value", "") if isinstance(raw, Mapping) else raw
            if key in TRITON_PARAMETERS:
                continue
            if not isinstance(value, str):
                raise ValueError(f"{key}: expected a string parameter value, got {value!r}")
            value = value.strip()
            if value == "":
                continue
            settings[key] = PARSERS[key](key, value)
        return cls.from_settings(**settings)


# EngineConfig's groups: field name -> sub-config class
GROUPS = {"model": ServedModelConfig, "cache": CacheConfig, "scheduler": SchedulerConfig,
          "speculative": SpeculativeConfig, "structured_output": StructuredOutputConfig, "lora": LoRAConfig,
          "execution": ExecutionConfig}
# every setting (a config.pbtxt parameter of the llm model) -> the group that holds it
SETTING_GROUPS = {f.name: group for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}


def _by_group(settings: Mapping[str, object]) -> dict[str, dict[str, object]]:
    """Flat settings split by group; an unknown name is refused, naming it."""
    groups: dict[str, dict[str, object]] = {}
    for key, value in settings.items():
        if key not in SETTING_GROUPS:
            raise ValueError(f"{key}: not an engine setting")
        groups.setdefault(SETTING_GROUPS[key], {})[key] = value
    return groups
