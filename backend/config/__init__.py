"""The engine's configuration: ``EngineConfig`` (engine.py) composed of one frozen sub-config per concern
(groups.py), each validating its fields; ``config.pbtxt`` strings parsed per setting (parameters.py)."""
from backend.config.engine import GROUPS, SETTING_GROUPS, TEST_ONLY_PARAMETERS, EngineConfig
from backend.config.groups import (DEVICES, DRAFT_COUPLINGS, DTYPES, KV_CACHE_DTYPES, LORA_NAME, MAX_NGRAM,
                                   MAX_SPECULATIVE_TOKENS, QUANTIZATION_MODES, SPECULATIVE_METHODS,
                                   SWITCH_INTERVAL_MS, CacheConfig, ExecutionConfig, LoRAConfig, SchedulerConfig,
                                   ServedModelConfig, SpeculativeConfig, StructuredOutputConfig)

__all__ = ["EngineConfig", "GROUPS", "SETTING_GROUPS", "TEST_ONLY_PARAMETERS", "ServedModelConfig", "CacheConfig",
           "SchedulerConfig", "SpeculativeConfig", "StructuredOutputConfig", "LoRAConfig", "ExecutionConfig",
           "DEVICES", "DTYPES", "SPECULATIVE_METHODS", "DRAFT_COUPLINGS", "MAX_SPECULATIVE_TOKENS", "MAX_NGRAM",
           "SWITCH_INTERVAL_MS", "QUANTIZATION_MODES", "KV_CACHE_DTYPES", "LORA_NAME"]
