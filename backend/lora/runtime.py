"""``LoraRuntime``: an engine's adapters, assembled once: the registry, the resident slots, the admission rule.

The builder makes one when ``EngineConfig.lora_enabled``; the engine checks each request's ``lora_name`` against it
(an unknown adapter fails the request naming it), the scheduler admits through ``admission.can_admit`` and the
runner gets each plan's ``LoraBatch`` from ``slots``. ``stats`` reports the requests running and waiting per
adapter (``/metrics``: per-adapter gauges and ``lora_requests_info``).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from backend.config import EngineConfig
from backend.core.scheduler import Scheduler
from backend.lora.registry import LoraRegistry, adapter_folders
from backend.lora.residency import LoraAdmission, LoraSlots
from backend.lora.stacked import StackedLoraWeights
from backend.model.config import ModelConfig
from contracts.sampling_params import SamplingParams
from contracts.triton_config import resolve_path


@dataclass(frozen=True)
class LoraStats:
    running: dict[str, int]   # adapter -> running sequences
    waiting: dict[str, int]   # adapter -> waiting sequences
    resident: list[str]       # adapters in the step's stacks
    max_loras: int


class LoraRuntime:
    def __init__(self, registry: LoraRegistry, slots: LoraSlots, admission: LoraAdmission, scheduler: Scheduler):
        self.registry, self.slots, self.admission, self._scheduler = registry, slots, admission, scheduler

    @classmethod
    def build(cls, config: EngineConfig, cfg: ModelConfig, device: torch.device, scheduler: Scheduler) -> LoraRuntime:
        folders = adapter_folders(tuple((n, str(resolve_path(f))) for n, f in config.lora_adapters or ()), config.lora_dir)
        registry = LoraRegistry(folders, cfg, max_cpu_loras=config.max_cpu_loras or max(len(folders), 1),
                                max_rank=config.max_lora_rank)
        weights = StackedLoraWeights(cfg, config.max_loras, config.max_lora_rank, device)
        admission = LoraAdmission(config.max_loras, lambda: scheduler.running, lambda: scheduler.waiting)
        return cls(registry, LoraSlots(registry, weights), admission, scheduler)

    @property
    def names(self) -> list[str]:
        return self.registry.names

    def check(self, params: SamplingParams) -> None:
        """``ValueError`` naming ``lora_name`` when the request's adapter is not served."""
        if params.lora_name is not None:
            self.registry.check_name(params.lora_name)

    def stats(self) -> LoraStats:
        """Read from any thread: the loop may change the queues meanwhile (a changed deque is read again)."""
        s = self._scheduler
        for _ in range(8):
            try:
                running, waiting = list(s.running), list(s.waiting)
                break
            except RuntimeError:   # "deque mutated during iteration"
                continue
        else:
            running, waiting = [], []
        count = lambda seqs: dict(Counter(q.params.lora_name for q in seqs if q.params.lora_name is not None))
        return LoraStats(count(running), count(waiting), self.slots.resident(), self.admission.max_loras)
