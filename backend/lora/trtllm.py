"""TensorRT-LLM's per-request LoRA contract, so its clients work unchanged.

A request carries ``lora_task_id`` (UINT64) and, on first use, ``lora_weights`` ``[M, W]`` and ``lora_config``
``[M, 3]`` INT32 (module id, layer, adapter size ``r``): row ``i`` of the weights is the module's ``A [r, in]``
flattened, then its ``B [out, r]`` flattened, zero-padded to ``W`` (TensorRT-LLM's ``hf_lora_convert.py`` layout,
``D*Hi + Ho*D``), the scaling already folded in as its conversion does. The adapter is then cached under the id; a
later request sends the id alone. Module ids (TensorRT-LLM's ``LoraModule``, Llama's mapping): 1 q, 2 k, 3 v,
4 o (``attn_dense``), 5 gate (``mlp_h_to_4h``), 6 down (``mlp_4h_to_h``), 7 up (``mlp_gate``); the fused
``attn_qkv`` (0) and others are refused naming ``lora_config``, and so are these on a base whose checkpoint fuses
them (Phi-3: its adapters are served by name, from PEFT folders).
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from backend.lora.adapter import LoraAdapter, LoraPart
from backend.lora.adapter_config import LoraAdapterConfig
from backend.lora.layout import module_shapes
from backend.model.config import ModelConfig

MODULE_IDS = {1: "q_proj", 2: "k_proj", 3: "v_proj", 4: "o_proj", 5: "gate_proj", 6: "down_proj", 7: "up_proj"}
ID_OF_MODULE = {m: i for i, m in MODULE_IDS.items()}


def task_name(task_id: int) -> str:
    """The adapter name a TensorRT-LLM task id is served under (request log, metrics, prefix-cache key)."""
    return f"trtllm-task-{task_id}"


def not_found_message(task_id: int) -> str:
    return f"lora_task_id: LoRA task {task_id} not found in cache. Please send LoRA weights with request"


def adapter_from_trtllm(task_id: int, weights: np.ndarray, config: np.ndarray, cfg: ModelConfig,
                        max_rank: int) -> LoraAdapter:
    """The adapter of ``lora_weights`` ``[M, W]`` and ``lora_config`` ``[M, 3]`` (a leading batch dim of 1 is
    dropped); ``ValueError`` naming the tensor for anything that does not fit the base model."""
    w = np.asarray(weights, dtype=np.float32)
    c = np.asarray(config)
    w = w[0] if w.ndim == 3 and w.shape[0] == 1 else w
    c = c[0] if c.ndim == 3 and c.shape[0] == 1 else c
    if c.ndim != 2 or c.shape[1] != 3 or c.shape[0] == 0:
        raise ValueError(f"lora_config: expected [modules x layers, 3] (module id, layer, adapter size), got "
                         f"shape {list(c.shape)}")
    if w.ndim != 2 or w.shape[0] != c.shape[0]:
        raise ValueError(f"lora_weights: expected one row per lora_config row ({c.shape[0]}), got shape "
                         f"{list(w.shape)}")
    shapes = module_shapes(cfg)
    parts: dict[tuple[int, str], LoraPart] = {}
    digest = hashlib.sha256(str(task_id).encode())
    for i, (module_id, layer, r) in enumerate(c.tolist()):
        module = MODULE_IDS.get(module_id)
        if module is None:
            raise ValueError(f"lora_config: row {i}: module id {module_id} is not supported (expected one of "
                             f"{sorted(MODULE_IDS)}: q, k, v, o, gate, down, up)")
        if module not in shapes:
            raise ValueError(f"lora_config: row {i}: module id {module_id} ({module}) is not a projection of the "
                             f"{cfg.architecture.hf_class} base (its projections: {', '.join(shapes)})")
        if not 0 <= layer < cfg.num_hidden_layers:
            raise ValueError(f"lora_config: row {i}: layer {layer} is outside the model's {cfg.num_hidden_layers}")
        if not 1 <= r <= max_rank:
            raise ValueError(f"lora_config: row {i}: adapter size {r} is outside [1, max_lora_rank={max_rank}]")
        if (layer, module) in parts:
            raise ValueError(f"lora_config: row {i}: layer {layer} {module} is given twice")
        out, inp = shapes[module]
        need = r * inp + out * r
        if need > w.shape[1] or np.any(w[i, need:]):
            raise ValueError(f"lora_weights: row {i} ({module}, layer {layer}, r={r}) needs {need} values "
                             f"(r x {inp} then {out} x r) followed by padding zeros, the row has {w.shape[1]}")
        row = torch.from_numpy(np.ascontiguousarray(w[i, :need]))
        parts[(layer, module)] = LoraPart(row[:r * inp].view(r, inp).clone(), row[r * inp:].view(out, r).clone())
        digest.update(row.numpy().tobytes() + bytes(f"{module_id},{layer},{r}", "ascii"))
    rank = max(p.a.shape[0] for p in parts.values())
    config_ = LoraAdapterConfig(rank, float(rank), False, frozenset(m for _, m in parts))   # scaling 1: folded in
    return LoraAdapter(task_name(task_id), config_, parts, digest.hexdigest()[:32])


def trtllm_tensors(adapter: LoraAdapter) -> tuple[np.ndarray, np.ndarray]:
    """``(lora_weights [M, W] float32, lora_config [M, 3] int32)`` of an adapter (its scaling is in ``B``)."""
    rows, config = [], []
    for (layer, module), part in sorted(adapter.parts.items()):
        if module not in ID_OF_MODULE:
            raise ValueError(f"{adapter.name}: {module} has no TensorRT-LLM module id here (ids: "
                             f"{', '.join(f'{i} {m}' for i, m in MODULE_IDS.items())})")
        rows.append(np.concatenate([part.a.numpy().ravel(), part.b.numpy().ravel()]))
        config.append([ID_OF_MODULE[module], layer, part.a.shape[0]])
    width = max(len(r) for r in rows)
    weights = np.zeros((len(rows), width), dtype=np.float32)
    for i, r in enumerate(rows):
        weights[i, :len(r)] = r
    return weights, np.asarray(config, dtype=np.int32)
