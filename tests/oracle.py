"""Reference generation helpers shared by the oracle tests."""
from __future__ import annotations

import torch

from backend.attention.dense import DenseCausalAttention


@torch.no_grad()
def dense_logits(model, ids: list[int]) -> torch.Tensor:
    """Logits ``[len(ids), vocab]`` of our model over one sequence, no KV cache."""
    t = torch.tensor(ids)
    hidden = model(t, torch.arange(len(ids)), DenseCausalAttention(1, len(ids)))
    return model.compute_logits(hidden)


@torch.no_grad()
def dense_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation by full recomputation each step (slow, obviously correct)."""
    ids = list(prompt)
    for _ in range(max_new_tokens):
        ids.append(int(dense_logits(model, ids)[-1].argmax()))
    return ids[len(prompt):]


@torch.no_grad()
def hf_greedy(hf_model, prompt: list[int], max_new_tokens: int) -> list[int]:
    out = hf_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                            do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                            pad_token_id=0)
    return out[0, len(prompt):].tolist()
