"""How many KV blocks the engine gets.

- ``num_kv_blocks``, when set;
- else ``kv_cache_bytes``, the target's pool in bytes, on any device (a draft model's pool has as many
  blocks, in its own bytes per block, on top);
- else 256 MiB on the CPU, and on CUDA this engine's share of the card, ``gpu_memory_utilization`` of it (as
  in vLLM: the fraction is this engine's, whatever else runs), less the target's weights, the draft model's
  weights (loaded after the pool is sized) and a headroom for activations and CUDA graphs, shared between the
  target's and the draft's pools block for block. A share larger than the free memory is refused.

Every refusal is a ``ValueError`` naming the setting to change.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from backend.config import EngineConfig
from backend.core.kv_cache import kv_bytes_per_block
from backend.model.config import ModelConfig
from backend.model.loader import hf_tensor_shapes

CPU_KV_CACHE_BYTES = 256 << 20     # the CPU pool when neither num_kv_blocks nor kv_cache_bytes is set
CUDA_HEADROOM_BYTES = 512 << 20    # activations and captured graphs, outside the KV pool


@dataclass(frozen=True)
class DraftFootprint:
    """What a draft model adds: its weights (loaded after the pool is sized) and its KV bytes per block."""
    weight_bytes: int
    kv_bytes_per_block: int


def draft_footprint(config: EngineConfig, dtype: torch.dtype) -> DraftFootprint:
    """Zero unless the method is ``draft`` with a readable config (a bad path fails in the draft's own load)."""
    folder = Path(config.speculative.draft_model_path or "")
    if config.speculative.speculative_method != "draft" or not (folder / "config.json").is_file():
        return DraftFootprint(0, 0)
    dcfg = ModelConfig.from_file(folder / "config.json")
    size = torch.empty((), dtype=dtype).element_size()
    weights = sum(math.prod(shape) for shape in hf_tensor_shapes(dcfg).values()) * size
    return DraftFootprint(weights, kv_bytes_per_block(dcfg.num_hidden_layers, config.cache.block_size,
                                                      dcfg.num_key_value_heads, dcfg.head_dim, dtype))


def num_kv_blocks(config: EngineConfig, target: ModelConfig, device: torch.device, dtype: torch.dtype,
                  weight_bytes: int = 0) -> int:
    """Blocks of the target's pool (the draft's has as many); ``weight_bytes``: the target's, already loaded."""
    if config.cache.num_kv_blocks is not None:
        return config.cache.num_kv_blocks
    per_block = kv_bytes_per_block(target.num_hidden_layers, config.cache.block_size, target.num_key_value_heads,
                                   target.head_dim, dtype, config.cache.kv_cache_dtype)
    draft = draft_footprint(config, dtype)
    both = per_block + draft.kv_bytes_per_block
    if config.cache.kv_cache_bytes is not None or device.type != "cuda":
        setting = "kv_cache_bytes"
        budget = config.cache.kv_cache_bytes if config.cache.kv_cache_bytes is not None else CPU_KV_CACHE_BYTES
        blocks = budget // per_block
        if blocks < 1:
            raise ValueError(f"kv_cache_bytes: a budget of {budget} bytes holds no KV block ({per_block} bytes "
                             "per block)")
        if device.type != "cuda":
            return blocks
    else:
        setting, util = "gpu_memory_utilization", config.cache.gpu_memory_utilization
        total = torch.cuda.mem_get_info(device)[1]
        budget = int(total * util) - weight_bytes - draft.weight_bytes - CUDA_HEADROOM_BYTES
        blocks = budget // both
        if blocks < 1:
            raise ValueError(f"gpu_memory_utilization: {util} of {total} bytes, less {weight_bytes + draft.weight_bytes}"
                             f" bytes of weights, leaves no KV block ({both} bytes per block): raise it, or set "
                             "kv_cache_bytes or num_kv_blocks")
    need = blocks * both + draft.weight_bytes + CUDA_HEADROOM_BYTES
    free, total = torch.cuda.mem_get_info(device)
    if need > free:
        raise ValueError(f"{setting}: the KV pool needs {need} more bytes of GPU memory (the draft's weights and "
                         f"{CUDA_HEADROOM_BYTES} of headroom included), and {free} of {total} are free: lower it, or "
                         "set num_kv_blocks")
    return blocks
