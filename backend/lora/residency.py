"""Which adapters sit in the step's stacks (``max_loras`` slots), and which waiting sequences may start.

``LoraSlots.assign`` gives every adapter of a plan a slot, installing it over the least recently used slot that
the plan does not need. The scheduler guarantees a plan never needs more than ``max_loras`` adapters: a waiting
sequence is admitted (``LoraAdmission.can_admit``) only when its adapter is already held by a running sequence
or fewer than ``max_loras`` adapters run. Others wait in the queue, never fail; sequences of running adapters and
of the base model may overtake them, until the oldest one has been passed over ``patience`` times: then no
sequence of another adapter starts before it, so the running ones drain and a slot frees (no starvation).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterable

from backend.core.plan import SchedulerOutput
from backend.core.sequence import Sequence
from backend.lora.delta import LoraBatch
from backend.lora.registry import LoraRegistry
from backend.lora.stacked import StackedLoraWeights


class LoraSlots:
    def __init__(self, registry: LoraRegistry, weights: StackedLoraWeights):
        self.registry, self.weights = registry, weights
        self._slot_of: OrderedDict[str, int] = OrderedDict()   # resident adapters, least recently used first
        self.installs = 0                                        # adapters written into a slot, cumulative

    def resident(self) -> list[str]:
        return list(self._slot_of)

    def assign(self, names: Iterable[str]) -> dict[str, int]:
        """Slot of each adapter the plan uses (``ValueError`` when they outnumber the slots)."""
        wanted = list(dict.fromkeys(names))
        if len(wanted) > self.weights.num_slots:
            raise ValueError(f"max_loras: a step needs {len(wanted)} adapters, more than {self.weights.num_slots}")
        for name in wanted:
            if name in self._slot_of:
                self._slot_of.move_to_end(name)
        for name in wanted:
            if name not in self._slot_of:
                self._install(name, set(wanted))
        return {name: self._slot_of[name] for name in wanted}

    def batch(self, plan: SchedulerOutput) -> LoraBatch | None:
        """The plan's adapters in their slots and each token's slot (plan order); None when no token has one."""
        names = [s.seq.params.lora_name for s in plan.scheduled]
        if not any(n is not None for n in names):
            return None
        slot = self.assign(n for n in names if n is not None)
        token_slots = [slot[n] if n is not None else -1 for s, n in zip(plan.scheduled, names)
                       for _ in range(s.num_new_tokens)]
        return LoraBatch.of(self.weights, token_slots)

    def _install(self, name: str, keep: set[str]) -> None:
        used = set(self._slot_of.values())
        free = [s for s in range(self.weights.num_slots) if s not in used]
        if free:
            slot = free[0]
        else:
            victim = next(n for n in self._slot_of if n not in keep)
            slot = self._slot_of.pop(victim)
        self.weights.install(slot, self.registry.get(name))
        self._slot_of[name] = slot
        self.installs += 1


class LoraAdmission:
    """``can_admit`` for the scheduler; ``begin_step`` once per step, before ``Scheduler.schedule``."""

    def __init__(self, max_loras: int, running: Callable[[], list[Sequence]],
                 waiting: Callable[[], Iterable[Sequence]], patience: int = 64):
        self.max_loras, self.patience = max_loras, patience
        self._running, self._waiting = running, waiting
        self._passed: dict[int, int] = {}      # seq_id -> steps it waited for a slot
        self._starving: Sequence | None = None

    def running_adapters(self) -> set[str]:
        return {s.params.lora_name for s in self._running() if s.params.lora_name is not None}

    def begin_step(self) -> None:
        """Count one more step for each sequence waiting for a slot; pick the oldest that ran out of patience."""
        running = self.running_adapters()
        full = len(running) >= self.max_loras
        passed, self._starving = {}, None
        for s in self._waiting():
            name = s.params.lora_name
            if name is None or name in running or not full:
                continue
            passed[s.seq_id] = self._passed.get(s.seq_id, 0) + 1
            if self._starving is None and passed[s.seq_id] >= self.patience:
                self._starving = s
        self._passed = passed

    def can_admit(self, seq: Sequence) -> bool:
        name = seq.params.lora_name
        if name is None:
            return True
        running, starving = self.running_adapters(), self._starving
        if name in running:
            return starving is None or starving.params.lora_name == name
        return len(running) < self.max_loras and (starving is None or starving is seq)
