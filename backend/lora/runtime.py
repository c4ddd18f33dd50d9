"""``LoraRuntime``: an engine's adapters, assembled once: the registry, the resident slots, the admission rule.

The builder makes one when ``EngineConfig.lora.enabled``; the engine checks each request's ``lora_name`` against it
(an unknown adapter fails the request naming it), the scheduler admits through ``admission.can_admit`` and the
runner gets each plan's ``LoraBatch`` from ``slots``. ``stats`` reports the requests running and waiting per
adapter (``/metrics``: per-adapter gauges and ``lora_requests_info``).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np

import torch

from backend.config import EngineConfig
from backend.core.scheduler import Scheduler
from backend.lora.registry import LoraRegistry, adapter_folders
from backend.lora.residency import LoraAdmission, LoraSlots
from backend.lora.stacked import StackedLoraWeights
from backend.lora.trtllm import adapter_from_trtllm, not_found_message, task_name
from backend.model.config import ModelConfig
from contracts.sampling_params import SamplingParams
from contracts.triton_config import resolve_path


@dataclass(frozen=True)
class LoraStats:
    running: dict[str, int]   # adapter -> running sequences
    waiting: dict[str, int]   # adapter -> waiting sequences
    resident: list[str]       # adapters in the step's stacks
    max_loras: int


def cuda_kernel(device: torch.device, dtype: torch.dtype):
    """On CUDA the Triton delta once it has matched its reference there; else None (torch segments)."""
    if device.type != "cuda":
        return None
    try:
        from backend.lora.triton_delta import triton_delta_matches, triton_lora_delta
        return triton_lora_delta if triton_delta_matches(device, dtype) else None
    except Exception:   # no triton, or a kernel that does not compile here: the torch path serves
        return None


class LoraRuntime:
    def __init__(self, registry: LoraRegistry, slots: LoraSlots, admission: LoraAdmission, scheduler: Scheduler):
        self.registry, self.slots, self.admission, self._scheduler = registry, slots, admission, scheduler

    @classmethod
    def build(cls, config: EngineConfig, cfg: ModelConfig, device: torch.device, scheduler: Scheduler,
              dtype: torch.dtype = torch.float32) -> LoraRuntime:
        folders = adapter_folders(tuple((n, str(resolve_path(f))) for n, f in config.lora.lora_adapters or ()),
                                  config.lora.lora_dir)
        registry = LoraRegistry(folders, cfg, max_cpu_loras=config.lora.max_cpu_loras or max(len(folders), 1),
                                max_rank=config.lora.max_lora_rank)
        weights = StackedLoraWeights(cfg, config.lora.max_loras, config.lora.max_lora_rank, device, dtype)
        weights.kernel = cuda_kernel(device, dtype)
        admission = LoraAdmission(config.lora.max_loras, lambda: scheduler.running, lambda: scheduler.waiting)
        return cls(registry, LoraSlots(registry, weights), admission, scheduler)

    @property
    def names(self) -> list[str]:
        return self.registry.names

    def check(self, params: SamplingParams) -> None:
        """``ValueError`` naming ``lora_name`` when the request's adapter is not served."""
        if params.lora_name is not None:
            self.registry.check_name(params.lora_name)

    def resolve_task(self, task_id: int, weights: np.ndarray | None, config: np.ndarray | None) -> str:
        """The adapter name of a TensorRT-LLM task: cached from ``weights`` / ``config`` when sent, else looked up
        (``ValueError`` with TensorRT-LLM's message when it is not cached)."""
        name = task_name(task_id)
        if weights is None and config is None:
            if self.registry.task(name) is None:
                raise ValueError(not_found_message(task_id))
            return name
        if weights is None or config is None:
            raise ValueError(f"{'lora_config' if config is None else 'lora_weights'}: required with "
                             f"{'lora_weights' if config is None else 'lora_config'}")
        adapter = adapter_from_trtllm(task_id, weights, config, self.registry.cfg, self.registry.max_rank)
        cached = self.registry.task(name)
        if cached is not None and cached.identity != adapter.identity:
            raise ValueError(f"lora_weights: LoRA task {task_id} is cached with other weights; use a new task id")
        if cached is None:
            self.registry.add_task(adapter)
        return name

    def hold(self, name: str, on_output: Callable) -> Callable:
        """``on_output`` that keeps a task's adapter cached until its request's final output."""
        if self.registry.task(name) is None:
            return on_output
        self.registry.pin(name)

        def released(out) -> None:
            if out.request_finished:
                self.registry.unpin(name)
            on_output(out)
        return released

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
