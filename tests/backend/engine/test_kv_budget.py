"""KV pool sizing (backend/engine/kv_budget.py): num_kv_blocks, else kv_cache_bytes on any device, else 256 MiB
on the CPU and gpu_memory_utilization on CUDA, where a draft model's weights and pool share the budget. The CUDA
arithmetic runs here against a stubbed ``torch.cuda.mem_get_info``."""
from __future__ import annotations

import math

import pytest
import torch

from backend.config import EngineConfig
from backend.core.kv_cache import kv_bytes_per_block
from backend.engine import kv_budget
from backend.engine.kv_budget import CPU_KV_CACHE_BYTES, CUDA_HEADROOM_BYTES, draft_footprint, num_kv_blocks
from backend.model.config import ModelConfig
from backend.model.loader import hf_tensor_shapes
from tests.helpers.checkpoints import DEMO_DRAFT, DEMO_TARGET

CUDA = torch.device("cuda")
GIB = 1 << 30


@pytest.fixture(scope="module")
def target() -> ModelConfig:
    return ModelConfig.from_file(DEMO_TARGET / "config.json")


def per_block(cfg: ModelConfig, dtype=torch.float32, kv="auto", block_size=16) -> int:
    return kv_bytes_per_block(cfg.num_hidden_layers, block_size, cfg.num_key_value_heads, cfg.head_dim, dtype, kv)


def fake_gpu(monkeypatch, free: int, total: int) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))


def test_cpu_pool_is_kv_cache_bytes_or_256_mib(target):
    cfg = EngineConfig.from_settings(model_path="/m")
    assert cfg.cache.kv_cache_bytes is None
    assert num_kv_blocks(cfg, target, torch.device("cpu"), torch.float32) == CPU_KV_CACHE_BYTES // per_block(target)
    cfg = EngineConfig.from_settings(model_path="/m", kv_cache_bytes=per_block(target) * 7 + 5)
    assert num_kv_blocks(cfg, target, torch.device("cpu"), torch.float32) == 7
    assert num_kv_blocks(EngineConfig.from_settings(model_path="/m", num_kv_blocks=3), target, CUDA, torch.float32) == 3
    with pytest.raises(ValueError, match="kv_cache_bytes"):
        num_kv_blocks(EngineConfig.from_settings(model_path="/m", kv_cache_bytes=100), target, torch.device("cpu"),
                      torch.float32)


def test_draft_footprint_counts_its_weights_and_kv(target):
    dcfg = ModelConfig.from_file(DEMO_DRAFT / "config.json")
    cfg = EngineConfig.from_settings(model_path=str(DEMO_TARGET), speculative_method="draft",
                                     draft_model_path=str(DEMO_DRAFT))
    fp = draft_footprint(cfg, torch.bfloat16)
    assert fp.weight_bytes == 2 * sum(math.prod(s) for s in hf_tensor_shapes(dcfg).values())
    assert fp.kv_bytes_per_block == per_block(dcfg, torch.bfloat16)
    assert draft_footprint(EngineConfig.from_settings(model_path="/m"), torch.bfloat16).weight_bytes == 0
    assert draft_footprint(EngineConfig.from_settings(model_path="/m", speculative_method="ngram"),
                           torch.bfloat16).kv_bytes_per_block == 0


def test_cuda_pool_is_this_engines_share_less_weights_and_the_draft(monkeypatch, target):
    total, weights = 100 * GIB, 3 * GIB
    fake_gpu(monkeypatch, total - weights - 5 * GIB, total)     # 5 GiB held by another process
    plain = EngineConfig.from_settings(model_path="/m", gpu_memory_utilization=0.8)
    budget = int(total * 0.8) - weights - CUDA_HEADROOM_BYTES
    pb = per_block(target, torch.bfloat16)
    assert num_kv_blocks(plain, target, CUDA, torch.bfloat16, weights) == budget // pb
    spec = EngineConfig.from_settings(model_path=str(DEMO_TARGET), gpu_memory_utilization=0.8,
                                      speculative_method="draft",
                                      draft_model_path=str(DEMO_DRAFT))
    fp = draft_footprint(spec, torch.bfloat16)
    blocks = num_kv_blocks(spec, target, CUDA, torch.bfloat16, weights)
    assert blocks == (budget - fp.weight_bytes) // (pb + fp.kv_bytes_per_block)
    # both pools, both models' weights and the headroom fit in this engine's share
    assert blocks * (pb + fp.kv_bytes_per_block) + fp.weight_bytes + weights + CUDA_HEADROOM_BYTES <= total * 0.8


def test_cuda_refusals_name_the_setting(monkeypatch, target):
    weights = 2 * GIB
    fake_gpu(monkeypatch, 50 * GIB, 100 * GIB)     # another engine holds half the card: 0.85 does not fit
    with pytest.raises(ValueError, match="gpu_memory_utilization: the KV pool needs"):
        num_kv_blocks(EngineConfig.from_settings(model_path="/m"), target, CUDA, torch.bfloat16, weights)
    assert num_kv_blocks(EngineConfig.from_settings(model_path="/m", gpu_memory_utilization=0.4), target, CUDA,
                         torch.bfloat16,
                         weights) > 0
    with pytest.raises(ValueError, match="gpu_memory_utilization: 0.01 of"):       # weights alone exceed it
        num_kv_blocks(EngineConfig.from_settings(model_path="/m", gpu_memory_utilization=0.01), target, CUDA,
                      torch.bfloat16,
                      weights)
    # an explicit budget is used on CUDA too, and refused when it does not fit in free memory
    fake_gpu(monkeypatch, 4 * GIB, 100 * GIB)
    pb = per_block(target, torch.bfloat16)
    assert num_kv_blocks(EngineConfig.from_settings(model_path="/m", kv_cache_bytes=GIB), target, CUDA,
                         torch.bfloat16) == GIB // pb
    with pytest.raises(ValueError, match="kv_cache_bytes: the KV pool needs"):
        num_kv_blocks(EngineConfig.from_settings(model_path="/m", kv_cache_bytes=8 * GIB), target, CUDA, torch.bfloat16)


def test_module_has_no_device_state():
    # sizing reads memory when asked, never at import
    assert not any(isinstance(v, torch.Tensor) for v in vars(kv_budget).values())
