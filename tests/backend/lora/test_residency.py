"""Slots and admission: adapters come and go through ``max_loras`` slots (least recently used out, never one the
plan needs); a sequence waits while every slot is held by other running adapters, and the oldest waiting one is
never starved by sequences of running adapters."""
from __future__ import annotations

import pytest

from backend.core.sequence import Sequence
from backend.lora.residency import LoraAdmission, LoraSlots
from contracts.sampling_params import SamplingParams


class FakeRegistry:
    def get(self, name):
        return name


class FakeWeights:
    def __init__(self, num_slots):
        self.num_slots, self.installed = num_slots, {}

    def install(self, slot, adapter):
        self.installed[slot] = adapter


def test_slots_lru_keeps_what_the_plan_needs():
    weights = FakeWeights(2)
    slots = LoraSlots(FakeRegistry(), weights)
    assert slots.assign(["a", "b"]) == {"a": 0, "b": 1}
    assert slots.assign(["a"]) == {"a": 0}                 # b is now the least recently used
    assert slots.assign(["a", "c"]) == {"a": 0, "c": 1}    # c replaces b, not a
    assert weights.installed == {0: "a", 1: "c"} and slots.installs == 3
    assert slots.assign(["b", "c"]) == {"b": 0, "c": 1}
    with pytest.raises(ValueError, match="max_loras"):
        slots.assign(["a", "b", "c"])


def seq(i: int, name: str | None) -> Sequence:
    return Sequence(seq_id=i, request_id=f"r{i}", seq_index=0, prompt_token_ids=[0, 1],
                    params=SamplingParams(lora_name=name))


def test_admission_waits_for_a_slot_and_never_starves():
    running, waiting = [seq(0, "a"), seq(1, "b")], []
    adm = LoraAdmission(2, lambda: running, lambda: waiting, patience=3)
    late = seq(2, "c")
    waiting.append(late)
    adm.begin_step()
    assert not adm.can_admit(late)                      # both slots held by running adapters
    assert adm.can_admit(seq(3, "a")) and adm.can_admit(seq(4, None))
    for _ in range(2):
        adm.begin_step()
    assert not adm.can_admit(seq(5, "a"))               # c ran out of patience: no other adapter starts first
    assert adm.can_admit(seq(6, None))                  # the base model holds no slot
    running.pop()                                       # b's last sequence ends: a slot frees
    assert adm.can_admit(late)
