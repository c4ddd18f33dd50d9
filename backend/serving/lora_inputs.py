"""TensorRT-LLM's LoRA tensors on an ``llm`` request (``lora_task_id``, ``lora_weights``, ``lora_config``, routed
by the ensemble straight to the ``llm`` model): the adapter name the request runs under (backend/lora/trtllm.py)."""
from __future__ import annotations

import numpy as np

from contracts import wire


def lora_task_name(pb_utils, request, engine) -> str | None:
    """The task's adapter name (its weights cached when sent), None without ``lora_task_id``; ``ValueError``
    naming the tensor for a bad one, or with TensorRT-LLM's message for an id not cached."""
    def tensor(name: str):
        t = pb_utils.get_input_tensor_by_name(request, name)
        return None if t is None else np.asarray(t.as_numpy())

    task, weights, config = tensor(wire.LORA_TASK_ID), tensor(wire.LORA_WEIGHTS), tensor(wire.LORA_CONFIG)
    if task is None:
        if weights is not None or config is not None:
            raise ValueError(f"lora_task_id: required with {'lora_weights' if weights is not None else 'lora_config'}")
        return None
    if task.size != 1:
        raise ValueError(f"lora_task_id: expected one id, got {task.size}")
    runtime = getattr(engine, "lora", None)
    if runtime is None:
        raise ValueError("lora_task_id: this engine serves no LoRA adapters (set lora_adapters or lora_dir)")
    return runtime.resolve_task(int(task.reshape(-1)[0]), weights, config)
