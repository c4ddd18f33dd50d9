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
def dense_greedy(model, prompt: list[int], max_new_tokens: int, banned: tuple[int, ...] = ()) -> list[int]:
    """Greedy continuation by full recomputation each step (slow, obviously correct).

    ``banned`` ids are never chosen: pass the EOS ids to match ``hf_greedy``, whose
    ``min_new_tokens`` masks EOS until the last token.
    """
    ids = list(prompt)
    for _ in range(max_new_tokens):
        logits = dense_logits(model, ids)[-1]
        logits[list(banned)] = float("-inf")
        ids.append(int(logits.argmax()))
    return ids[len(prompt):]


@torch.no_grad()
def hf_greedy(hf_model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """HF greedy with EOS masked for all ``max_new_tokens`` (``min_new_tokens``)."""
    out = hf_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                            do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                            pad_token_id=0)
    return out[0, len(prompt):].tolist()


def assert_streams_match(results: list, expected: list[list[int]]) -> None:
    """Each request's streamed tokens equal the reference; it ended once, with LENGTH (max_tokens)."""
    from backend.core.outputs import FinishReason
    from backend.engine.llm_engine import output_token_ids

    for i, outs in enumerate(results):
        got = output_token_ids(outs)
        first = next((j for j, (a, b) in enumerate(zip(got, expected[i])) if a != b), None)
        assert got == expected[i], f"request {i} differs from HF at output position {first}"
        assert outs[-1].request_finished and outs[-1].finish_reason is FinishReason.LENGTH
        assert sum(o.request_finished for o in outs) == 1
