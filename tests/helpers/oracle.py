"""Reference generation helpers shared by the oracle tests."""
from __future__ import annotations

import random

import torch

from backend.attention.dense import DenseCausalAttention


@torch.no_grad()
def dense_logits(model, ids: list[int]) -> torch.Tensor:
    """Logits ``[len(ids), vocab]`` of our model over one sequence, no KV cache (its sliding windows and attention
    scale as the config reads them)."""
    t = torch.tensor(ids)
    cfg = model.config
    attn = DenseCausalAttention(1, len(ids), windows=cfg.sliding_windows, scale=cfg.query_scale)
    hidden = model(t, torch.arange(len(ids)), attn)
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


def repeating_prompts(seed: int, n: int, *, stem_len: int, span_range: tuple[int, int], gap_range: tuple[int, int],
                      gap_always: bool = False, vocab: int = 4000) -> list[list[int]]:
    """Random-id prompts (BOS 0 first): odd ones start with a shared stem (prefix-cache hits), two in three
    repeat a span after a gap (n-gram drafts find it); ``gap_always``: the others get a gap too."""
    rng = random.Random(seed)
    stem = [rng.randrange(7, vocab) for _ in range(stem_len)]
    prompts = []
    for i in range(n):
        span = [rng.randrange(7, vocab) for _ in range(rng.randint(*span_range))]
        repeat = i % 3 != 0
        gap = [rng.randrange(7, vocab) for _ in range(rng.randint(*gap_range))] if repeat or gap_always else []
        body = span + gap + (span if repeat else [])
        prompts.append([0] + (stem + body if i % 2 else body))
    return prompts


def assert_same_tokens(got: list[int], expected: list[int], what: str) -> None:
    """Token-for-token equality, naming the first output position that differs."""
    first = next((j for j, (a, b) in enumerate(zip(got, expected)) if a != b), None)
    assert got == expected, f"{what} differs from HF at output position {first}"


def random_prompts(n: int, seed: int, min_len: int = 5, max_len: int = 60) -> list[list[int]]:
    """``n`` prompts of BOS (id 0) and random ids of the demo vocabulary, ``min_len``..``max_len`` tokens after it."""
    rng = random.Random(seed)
    return [[0] + [rng.randrange(7, 4000) for _ in range(rng.randint(min_len, max_len))] for _ in range(n)]


def assert_logits_match_hf(model, hf_model, prompts: list[list[int]], atol: float = 1e-4) -> None:
    """Our dense forward's logits equal ``hf_model``'s on every prompt (fp32)."""
    for ids in prompts:
        with torch.no_grad():
            ref = hf_model(torch.tensor([ids])).logits[0]
        torch.testing.assert_close(dense_logits(model, ids), ref, rtol=0, atol=atol)


def assert_greedy_matches_hf(model, hf_model, prompts: list[list[int]], new_tokens: int = 16) -> None:
    """Our dense greedy continuation (EOS id 1 banned, as ``hf_greedy``) equals transformers' ``generate``."""
    for ids in prompts:
        assert dense_greedy(model, ids, new_tokens, banned=(1,)) == hf_greedy(hf_model, ids, new_tokens)
