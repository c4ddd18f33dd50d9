"""Random PEFT adapters for a benchmark's checkpoint, written once under ``.cache/lora/`` (tools/make_lora_adapter)."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def bench_adapters(model: str, count: int, rank: int) -> tuple[tuple[str, str], ...]:
    """``count`` adapters of ``rank`` on every projection of ``model``, as ``lora_adapters`` pairs."""
    from tools.make_lora_adapter import make_adapter

    pairs = []
    for i in range(count):
        name = f"bench-r{rank}-{i}"
        folder = REPO / ".cache" / "lora" / Path(model).name / name
        if not (folder / "adapter_model.safetensors").is_file():
            make_adapter(model, folder, rank=rank, alpha=2 * rank, targets=TARGETS, scale=0.02, seed=i)
        pairs.append((name, str(folder)))
    return tuple(pairs)
