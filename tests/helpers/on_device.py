"""A pytest plugin that builds every engine a test makes on another device (CUDA by default), in fp32.

    python -m pytest -p tests.helpers.on_device tests/backend/engine/test_engine_oracle.py ...

runs the oracle suites through the GPU path (Triton paged-attention kernels, the GPU sampler, and CUDA graphs
when combined with ``-p tests.helpers.force_fast_decode``) against HF transformers on the CPU. fp32, because the
oracle compares greedy tokens with an fp32 reference; TF32 stays off (PyTorch's default for matmuls).

Two adjustments keep the tests' assumptions, which are about the engine and not about the card:
- an engine the test sized by neither ``num_kv_blocks`` nor ``kv_cache_bytes`` gets the CPU's 256 MiB pool
  (not 85% of the card, which the next engine in this process would find taken);
- before the first engine of each kind (model, speculation, capture), a throwaway engine of the same config
  generates a few tokens, so Triton's kernels are compiled before the test's clock-sensitive part (staggered
  arrivals that expect prefix-cache hits would otherwise all queue behind the first step's compile).
``ON_DEVICE=cpu`` runs the same plumbing here (a dry run of the plugin itself).
"""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def _warmed_kinds() -> set[tuple]:
    """The engine kinds already warmed in this pytest run."""
    return set()


@pytest.fixture(autouse=True)
def _on_device(monkeypatch, _warmed_kinds):
    from backend.engine import llm_engine
    from backend.engine.kv_budget import CPU_KV_CACHE_BYTES
    from contracts.sampling_params import SamplingParams

    device = os.environ.get("ON_DEVICE", "cuda")
    init = llm_engine.LLMEngine.__init__

    def on_device(self, config, parts=None):
        config = config.with_settings(device=device, dtype="float32")
        if config.cache.num_kv_blocks is None and config.cache.kv_cache_bytes is None:
            config = config.with_settings(kv_cache_bytes=CPU_KV_CACHE_BYTES)
        kind = (config.model.model_path, config.speculative.draft_model_path, config.speculative.speculative_method,
                config.execution.fast_decode, config.cache.kv_cache_dtype)
        if parts is None and kind not in _warmed_kinds:
            _warmed_kinds.add(kind)
            warm = object.__new__(llm_engine.LLMEngine)
            init(warm, config.with_settings(num_kv_blocks=None, kv_cache_bytes=32 << 20, max_num_seqs=4))
            prompt = [0] + [11, 12, 13, 14, 15] * 8            # repeats: n-gram drafts, so verify steps run too
            warm.generate([prompt, prompt[:20]], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
            warm.shutdown()
        init(self, config, parts)

    monkeypatch.setattr(llm_engine.LLMEngine, "__init__", on_device)
