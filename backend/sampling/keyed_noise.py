"""Counter-based noise for sampling: every draw is a pure function of (seed, sequence index, position, stream).

A sampled token at output position ``t`` of sequence ``i`` of a request with seed ``s`` uses uniforms computed by
Philox4x32-10 (Salmon et al. 2011, the generator of cuRAND and JAX) with key ``s`` (two 32-bit words) and counter
``(t, i, stream, j)``. Nothing depends on how many numbers were drawn before, in this step or any other, so the
same request gives the same noise at the same position whatever the batch, the number of drafts verified per step,
preemption or the prefix cache. Streams keep the uses apart (``NoiseStream``); ``j`` is 0 for a position's one
uniform and the token pair ``v // 2`` for per-token noise (the four output words give two uniforms).

This module is the reference, in torch int64 tensor ops (any device: products of two 32-bit words wrap modulo
2**64 in int64 exactly as in uint64, and an arithmetic shift masked to 32 bits reads the high word).
``backend/native/csrc/keyed_draw.cpp`` computes the same bits on the CPU.
"""
from __future__ import annotations

from enum import IntEnum

import torch

MASK32 = 0xFFFFFFFF
PHILOX_M = (0xD2511F53, 0xCD9E8D57)     # round multipliers
PHILOX_W = (0x9E3779B9, 0xBB67AE85)     # Weyl key increments
PHILOX_ROUNDS = 10
UNIFORM_BITS = 52                      # (m + 0.5) * 2**-52 is exact in float64 and lies in (0, 1)


class NoiseStream(IntEnum):
    """The counter's third word: which use a uniform is for."""

    DRAW = 0          # the one uniform of an inverse-CDF draw at a position
    TOKEN = 1         # per-token noise of a Gumbel-max (exponential race) draw at a position
    ACCEPT = 2        # standard rejection sampling: the acceptance test of the draft at a position
    RESIDUAL = 3      # standard rejection sampling: the recovered token's draw from the residual
    DRAFT = 4         # a draft model's own proposals under standard rejection sampling


def key_words(seeds: list[int], device: torch.device | str = "cpu") -> torch.Tensor:  # -> [n, 2] int64
    """Each seed in [0, 2**64) as Philox's key: (low word, high word)."""
    return torch.tensor([[s & MASK32, (s >> 32) & MASK32] for s in seeds], dtype=torch.int64, device=device)


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    p = a * m                                   # int64, wraps as uint64 would
    return (p >> 32) & MASK32, p & MASK32


def philox4x32(counter: torch.Tensor,   # [..., 4] int64, each word in [0, 2**32)
               key: torch.Tensor,       # [..., 2] int64, each word in [0, 2**32), broadcast against counter
               ) -> torch.Tensor:       # [..., 4] int64: the four 32-bit output words
    """Philox4x32 with ten rounds: the counter's bijection under the key."""
    c0, c1, c2, c3 = counter.unbind(-1)
    k0, k1 = key.unbind(-1)
    for r in range(PHILOX_ROUNDS):
        if r:
            k0 = (k0 + PHILOX_W[0]) & MASK32
            k1 = (k1 + PHILOX_W[1]) & MASK32
        hi0, lo0 = _mulhilo(c0, PHILOX_M[0])
        hi1, lo1 = _mulhilo(c2, PHILOX_M[1])
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return torch.stack((c0, c1, c2, c3), dim=-1)


def words_to_uniform(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:   # int64 words -> float64 in (0, 1)
    """The 52 bits ``hi << 20 | lo >> 12`` (all of ``hi``, the top 20 of ``lo``) as the centre of their cell."""
    m = (hi << 20) | (lo >> 12)
    return (m.to(torch.float64) + 0.5) * 2.0 ** -UNIFORM_BITS


def position_uniforms(key: torch.Tensor,        # [n, 2] int64 (key_words)
                      seq_indices: torch.Tensor,  # [n] int64
                      positions: torch.Tensor,    # [n] int64
                      stream: NoiseStream,
                      ) -> torch.Tensor:          # [n] float64 in (0, 1)
    """One uniform per row: counter ``(position, seq_index, stream, 0)``."""
    zeros = torch.zeros_like(positions)
    counter = torch.stack((positions, seq_indices, zeros + int(stream), zeros), dim=-1)
    out = philox4x32(counter, key)
    return words_to_uniform(out[:, 0], out[:, 1])


def token_uniforms(key: torch.Tensor,          # [n, 2] int64
                   seq_indices: torch.Tensor,  # [n] int64
                   positions: torch.Tensor,    # [n] int64
                   vocab_size: int,
                   stream: NoiseStream = NoiseStream.TOKEN,
                   ) -> torch.Tensor:          # [n, vocab] float64 in (0, 1)
    """One uniform per row and token id, in id order: token ``v`` reads counter ``(position, seq_index, stream,
    v // 2)``, words 0-1 for even ``v`` and 2-3 for odd."""
    n, pairs = positions.shape[0], (vocab_size + 1) // 2
    j = torch.arange(pairs, dtype=torch.int64, device=positions.device)
    counter = torch.stack(torch.broadcast_tensors(positions[:, None], seq_indices[:, None],
                                                  torch.full_like(positions, int(stream))[:, None], j[None, :]), -1)
    out = philox4x32(counter, key[:, None, :])                                   # [n, pairs, 4]
    u = torch.stack((words_to_uniform(out[..., 0], out[..., 1]), words_to_uniform(out[..., 2], out[..., 3])), -1)
    return u.reshape(n, 2 * pairs)[:, :vocab_size]
