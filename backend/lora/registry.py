"""``LoraRegistry``: the served adapters by name, at most ``max_cpu_loras`` of them loaded, least recently used out.

Names come from ``lora_adapters`` (``name=folder`` pairs) and from the sub-folders of ``lora_dir`` that hold an
``adapter_config.json`` (named after the sub-folder). Every adapter is read and checked once at start, so a bad
one fails the model's load naming its field; afterwards ``get`` reloads an evicted one from its folder.
"""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from backend.lora.adapter import LoraAdapter, load_adapter
from backend.lora.adapter_config import LoraConfigError
from backend.model.config import ModelConfig


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
        self.identities: dict[str, str] = {}   # name -> digest of its weights (the prefix-cache key's part)
        for name in self.folders:
            adapter = self._load(name)
            self.identities[name] = adapter.identity
            self._keep(adapter)

    @property
    def names(self) -> list[str]:
        return sorted(self.folders)

    def check_name(self, name: str) -> None:
        """``ValueError`` naming ``lora_name`` when ``name`` is not served."""
        if name not in self.folders:
            served = ", ".join(self.names) or "none"
            raise ValueError(f"lora_name: unknown adapter {name!r} (served: {served})")

    def get(self, name: str) -> LoraAdapter:
        """The adapter, loaded from its folder when it is not in memory (the least recently used one leaves)."""
        adapter = self._loaded.get(name)
        if adapter is None:
            adapter = self._load(name)
            self._keep(adapter)
        else:
            self._loaded.move_to_end(name)
        return adapter

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
