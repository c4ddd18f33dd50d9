"""Three random PEFT adapters for the demo target (different ranks and targets, lora_B not zero) and their
HF + PEFT greedy outputs: the LoRA oracle tests' shared references."""
from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers.oracle import hf_greedy

# name -> make_adapter options: ranks 8 / 4 / 16 (one module at 4 by rank_pattern), attention-only, every
# projection with rsLoRA, MLP + o_proj with an alpha_pattern
ADAPTERS = {
    "qv8": dict(rank=8, alpha=16, targets=("q_proj", "v_proj"), scale=0.12, seed=1),
    "all4": dict(rank=4, alpha=8, targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj"), rslora=True, scale=0.1, seed=2),
    "mlp16": dict(rank=16, alpha=16, targets=("o_proj", "gate_proj", "up_proj", "down_proj"), scale=0.08, seed=3,
                  rank_pattern={"down_proj": 4}, alpha_pattern={"o_proj": 32}),
}


def write_adapters(base: Path, root: Path) -> dict[str, Path]:
    """The three adapters, their weights rounded to fp16 values: with scalings that are powers of two (all of
    ADAPTERS'), TensorRT-LLM's FP16 ``lora_weights`` then carry them exactly."""
    from bench.harness.lora_adapters import make_adapter

    folders = {name: make_adapter(base, root / name, **opts) for name, opts in ADAPTERS.items()}
    for folder in folders.values():
        fp16_exact(folder)
    return folders


def fp16_exact(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = folder / "adapter_model.safetensors"
    save_file({k: v.half().float() for k, v in load_file(str(path)).items()}, str(path))


@torch.no_grad()
def peft_greedy(base: Path, adapter: Path | None, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """HF transformers greedy (EOS masked) with PEFT applying ``adapter`` (None: the base model)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter)).eval()
    return [hf_greedy(model, p, new_tokens) for p in prompts]
