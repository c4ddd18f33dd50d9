"""The mixed-batch LoRA delta (eager segments and the native op) against the token-by-token reference; the
stacks laid out so a fused projection's delta is the sum of its parts'."""
from __future__ import annotations

import pytest
import torch

from backend.lora.adapter import LoraAdapter, LoraPart
from backend.lora.adapter_config import LoraAdapterConfig
from backend.lora.delta import LoraBatch, lora_delta_reference
from backend.lora.stacked import StackedLoraWeights
from backend.model.projection_delta import QKV
from backend.model.config import ModelConfig
from tests.helpers.checkpoints import DEMO_TARGET

SLOTS = [[-1, 0, 0, 2, -1, 1, 2, 2], [1, 1, 1], [-1], [0]]


def stacks(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(3, 12, 40, generator=g)
    b = torch.randn(3, 24, 12, generator=g)
    return a, b


@pytest.mark.parametrize("slots", SLOTS)
def test_eager_delta_matches_reference(slots):
    a, b = stacks()
    x = torch.randn(len(slots), 40)
    y = torch.randn(len(slots), 24)
    expected = y.double() + lora_delta_reference(x, a, b, torch.tensor(slots))
    weights = StackedLoraWeights.__new__(StackedLoraWeights)   # bare stacks of one layer and projection
    weights.a, weights.b, weights.active = [[a]], [[b]], [[[True]] for _ in range(3)]
    weights.device, weights.kernel = torch.device("cpu"), None
    batch = LoraBatch.of(weights, slots)
    if batch is None:
        assert all(s < 0 for s in slots)
        return
    batch.add(0, 0, x, y)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("slots", SLOTS)
def test_native_delta_matches_reference(native_lib, slots):
    a, b = stacks(1)
    x, y = torch.randn(len(slots), 40), torch.randn(len(slots), 24)
    got = native_lib.lora_delta(x, y, a, b, torch.tensor(slots, dtype=torch.int32))
    expected = y.double() + lora_delta_reference(x, a, b, torch.tensor(slots))
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-4)


def test_native_delta_refuses_a_slot_past_the_stack(native_lib):
    a, b = stacks()
    with pytest.raises(RuntimeError, match="slot 3"):
        native_lib.lora_delta(torch.randn(1, 40), torch.randn(1, 24), a, b, torch.tensor([3], dtype=torch.int32))


def test_fused_qkv_delta_is_the_sum_of_its_parts():
    cfg = ModelConfig.from_file(DEMO_TARGET / "config.json")
    d, q, kv = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    parts = {(0, "q_proj"): LoraPart(torch.randn(3, d), torch.randn(q, 3)),
             (0, "v_proj"): LoraPart(torch.randn(5, d), torch.randn(kv, 5))}
    adapter = LoraAdapter("x", LoraAdapterConfig(5, 5.0, False, frozenset({"q_proj", "v_proj"})), parts, "id")
    weights = StackedLoraWeights(cfg, num_slots=2, max_rank=8)
    weights.install(1, adapter)
    x = torch.randn(2, d)
    y = torch.zeros(2, q + 2 * kv)
    LoraBatch.of(weights, [1, -1]).add(0, QKV, x, y)
    p_q, p_v = parts[(0, "q_proj")], parts[(0, "v_proj")]
    torch.testing.assert_close(y[0, :q], p_q.b @ (p_q.a @ x[0]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y[0, q:q + kv], torch.zeros(kv))
    torch.testing.assert_close(y[0, q + kv:], p_v.b @ (p_v.a @ x[0]), rtol=1e-5, atol=1e-5)
    assert not y[1].any()
    weights.clear(1)
    assert not weights.a[0][QKV].any() and not weights.b[0][QKV].any()
