"""A pytest plugin that builds every engine a test makes on another device (CUDA by default), in fp32.

    python -m pytest -p tests.helpers.on_device tests/backend/engine/test_engine_oracle.py ...

runs the oracle suites through the GPU path (Triton paged-attention kernels, the GPU sampler, and CUDA graphs
when combined with ``-p tests.helpers.force_fast_decode``) against HF transformers on the CPU. fp32, because the
oracle compares greedy tokens with an fp32 reference; TF32 stays off (PyTorch's default for matmuls).
``ON_DEVICE=cpu`` runs the same plumbing here (a dry run of the plugin itself).
"""
from __future__ import annotations

import dataclasses
import os

import pytest


@pytest.fixture(autouse=True)
def _on_device(monkeypatch):
    from backend.engine import llm_engine

    device = os.environ.get("ON_DEVICE", "cuda")
    init = llm_engine.LLMEngine.__init__

    def on_device(self, config, parts=None):
        init(self, dataclasses.replace(config, device=device, dtype="float32"), parts)

    monkeypatch.setattr(llm_engine.LLMEngine, "__init__", on_device)
