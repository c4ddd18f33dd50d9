"""``LoraRegistry``: the served adapters by name, at most ``max_cpu_loras`` of them loaded, least recently used out.

Names come from ``lora_adapters`` (``name=folder`` pairs) and from the sub-folders of ``lora_dir`` that hold an
``adapter_config.json`` (named after the sub-folder). Every adapter is read and checked once at start, so a bad
one fails the model's load naming its field; afterwards ``get`` reloads an evicted one from its folder.
TensorRT-LLM tasks (weights sent with a request, ``trtllm.py``) are kept in memory, at most ``MAX_TASKS``: the least
recently used one that no request in flight holds (``pin`` / ``unpin``) leaves. Thread-safe: requests register
and check on Triton's threads, the engine loop reads.
"""
from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from pathlib import Path

from backend.lora.adapter import LoraAdapter, load_adapter
from backend.lora.adapter_config import LoraConfigError
from backend.model.config import ModelConfig

MAX_TASKS = 64   # TensorRT-LLM tasks cached at once


def adapter_folders(adapters: tuple[tuple[str, str], ...], lora_dir: str | None) -> dict[str, Path]:
    """Name -> folder: the configured pairs, then ``lora_dir``'s adapter sub-folders (a name given twice fails)."""
    out: dict[str, Path] = {}
    for name, folder in adapters:
        if name in out:
            raise LoraConfigError(f"lora_adapters: adapter name {name!r} is given twice")
        out[name] = Path(folder)
    if lora_dir is not None:
        root = Path(lora_dir)
        if not root.is_dir():
            raise LoraConfigError(f"lora_dir: {root} is not a folder")
        for sub in sorted(p for p in root.iterdir() if (p / "adapter_config.json").is_file()):
            if sub.name in out:
                raise LoraConfigError(f"lora_dir: adapter {sub.name!r} ({sub}) is also named in lora_adapters")
            out[sub.name] = sub
    return out


class LoraRegistry:
    def __init__(self, folders: dict[str, Path], cfg: ModelConfig, *, max_cpu_loras: int, max_rank: int):
        self.folders = dict(folders)
        self.cfg, self.max_cpu_loras, self.max_rank = cfg, max_cpu_loras, max_rank
        self._loaded: OrderedDict[str, LoraAdapter] = OrderedDict()
        self._tasks: OrderedDict[str, LoraAdapter] = OrderedDict()   # TensorRT-LLM tasks, least recently used first
        self._pins: Counter[str] = Counter()                          # requests in flight per task
        self._lock = threading.Lock()
        self.identities: dict[str, str] = {}   # name -> digest of its weights
        for name in self.folders:
            adapter = self._load(name)
            self.identities[name] = adapter.identity
            self._keep(adapter)

    @property
    def names(self) -> list[str]:
        return sorted(self.folders)

    def check_name(self, name: str) -> None:
        """``ValueError`` naming ``lora_name`` when ``name`` is not served."""
        if name not in self.folders and name not in self._tasks:
            served = ", ".join(self.names) or "none"
            raise ValueError(f"lora_name: unknown adapter {name!r} (served: {served})")

    def get(self, name: str) -> LoraAdapter:
        """The adapter, loaded from its folder when it is not in memory (the least recently used one leaves)."""
        with self._lock:
            task = self._tasks.get(name)
            if task is not None:
                self._tasks.move_to_end(name)
                return task
            adapter = self._loaded.get(name)
            if adapter is not None:
                self._loaded.move_to_end(name)
                return adapter
        adapter = self._load(name)
        with self._lock:
            self._keep(adapter)
        return adapter

    def task(self, name: str) -> LoraAdapter | None:
        with self._lock:
            return self._tasks.get(name)

    def add_task(self, adapter: LoraAdapter) -> None:
        """Cache a TensorRT-LLM task's adapter (``ValueError`` naming ``lora_weights`` when every cached task is
        in use)."""
        with self._lock:
            if adapter.name not in self._tasks and len(self._tasks) >= MAX_TASKS:
                idle = next((n for n in self._tasks if not self._pins[n]), None)
                if idle is None:
                    raise ValueError(f"lora_weights: {MAX_TASKS} LoRA tasks are cached and in use; retry later")
                del self._tasks[idle]
            self._tasks[adapter.name] = adapter
            self._tasks.move_to_end(adapter.name)

    def pin(self, name: str) -> None:
        with self._lock:
            self._pins[name] += 1

    def unpin(self, name: str) -> None:
        with self._lock:
            self._pins[name] -= 1
            if self._pins[name] <= 0:
                del self._pins[name]

    def loaded_names(self) -> list[str]:
        return list(self._loaded)

    def _load(self, name: str) -> LoraAdapter:
        adapter = load_adapter(self.folders[name], name, self.cfg)
        if adapter.max_rank > self.max_rank:
            raise LoraConfigError(f"lora adapter {name!r} ({self.folders[name]}): r: rank {adapter.max_rank} exceeds "
                                  f"max_lora_rank ({self.max_rank})")
        return adapter

    def _keep(self, adapter: LoraAdapter) -> None:
        self._loaded[adapter.name] = adapter
        self._loaded.move_to_end(adapter.name)
        while len(self._loaded) > self.max_cpu_loras:
            self._loaded.popitem(last=False)
