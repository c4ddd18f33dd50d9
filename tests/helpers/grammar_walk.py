"""Random walks through a grammar over the real vocabulary: outputs the grammar admits, no model needed."""
from __future__ import annotations

import random

import numpy as np
import torch


def allowed_token_ids(bitmask_row: torch.Tensor, vocab_size: int) -> list[int]:
    bits = np.unpackbits(bitmask_row.numpy().view(np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits).tolist()


def random_walk(backend, compiled, rng: random.Random, eos_ids: set[int], *, max_tokens: int = 150,
                eos_bias: float = 0.3) -> tuple[list[int], bool]:
    """(tokens before EOS, whether the grammar terminated). Uniform over the admitted tokens, taking EOS
    with probability ``eos_bias`` where the grammar admits it."""
    m = backend.matcher(compiled)
    bitmask = backend.allocate_bitmask(1)
    out: list[int] = []
    for _ in range(max_tokens):
        m.fill_bitmask(bitmask, 0)
        allowed = allowed_token_ids(bitmask[0], backend.vocab_size)
        stops = [t for t in allowed if t in eos_ids]
        others = [t for t in allowed if t not in eos_ids]
        t = rng.choice(stops) if stops and (not others or rng.random() < eos_bias) else rng.choice(others)
        assert m.accept_tokens([t])
        if m.is_terminated():
            return out, True
        out.append(t)
    return out, False


def decode(backend, tokens: list[int]) -> str:
    vocab = backend.tokenizer_info.decoded_vocab
    return b"".join(vocab[t] for t in tokens).decode("utf-8", errors="replace")
