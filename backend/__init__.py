"""The LLM engine: Llama-family model, paged KV cache, scheduler, sampler, engine loop.

Public names (stable; benchmarks, tests and users import them from here or their modules):
``EngineConfig``, ``LLMEngine`` (``start`` / ``add_request`` / ``abort`` / ``shutdown``),
``SamplingParams``, ``RequestOutput`` (``new_token_ids``, ``request_finished``), ``FinishReason``.
Loaded lazily, so ``import backend.model.config`` does not pull in the engine.

Packages: ``core`` (what one step plans and its state), ``model`` (Llama and its loader),
``attention`` (backends and Triton kernels), ``sampling`` (the sampler), ``engine`` (the loop,
its assembly and the model runner), ``serving`` (the ``llm`` Triton model's logic and metrics).
See docs/engine-design.md.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "EngineConfig": "backend.config",
    "LLMEngine": "backend.engine.llm_engine",
    "output_token_ids": "backend.engine.llm_engine",
    "RequestOutput": "backend.core.outputs",
    "FinishReason": "backend.core.outputs",
    "SamplingParams": "contracts.sampling_params",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'backend' has no attribute {name!r}")
