"""Counter-based noise (backend/sampling/keyed_noise.py): Philox4x32-10 against the Random123 known-answer vectors,
the uniforms' range, and which counter words each use reads."""
from __future__ import annotations

import pytest
import torch

from backend.sampling.keyed_noise import (
    NoiseStream,
    key_words,
    philox4x32,
    position_uniforms,
    token_uniforms,
    words_to_uniform,
)

# Random123's kat_vectors for philox4x32_10: (counter, key, output), words as hex
KNOWN_ANSWERS = [
    ("00000000 00000000 00000000 00000000", "00000000 00000000", "6627e8d5 e169c58d bc57ac4c 9b00dbd8"),
    ("ffffffff ffffffff ffffffff ffffffff", "ffffffff ffffffff", "408f276d 41c83b0e a20bc7c6 6d5451fd"),
    ("243f6a88 85a308d3 13198a2e 03707344", "a4093822 299f31d0", "d16cfe09 94fdcceb 5001e420 24126ea1"),
]


def words(hex_words: str) -> torch.Tensor:   # -> [k] int64
    return torch.tensor([int(w, 16) for w in hex_words.split()], dtype=torch.int64)


def test_philox_matches_the_random123_known_answers():
    for counter, key, out in KNOWN_ANSWERS:
        assert philox4x32(words(counter), words(key)).tolist() == words(out).tolist()
    batch = philox4x32(torch.stack([words(c) for c, _, _ in KNOWN_ANSWERS]),
                       torch.stack([words(k) for _, k, _ in KNOWN_ANSWERS]))
    assert torch.equal(batch, torch.stack([words(o) for _, _, o in KNOWN_ANSWERS]))


def test_key_words_split_a_seed_into_low_and_high_words():
    assert key_words([0, 2**32 - 1, 2**32, 2**64 - 1, 0x0123456789ABCDEF]).tolist() == [
        [0, 0], [2**32 - 1, 0], [0, 1], [2**32 - 1, 2**32 - 1], [0x89ABCDEF, 0x01234567]]


def test_uniforms_lie_strictly_inside_zero_and_one():
    lo = words_to_uniform(torch.tensor([0]), torch.tensor([0]))
    hi = words_to_uniform(torch.tensor([2**32 - 1]), torch.tensor([2**32 - 1]))
    assert lo.item() == 2.0**-53 and hi.item() == 1 - 2.0**-53
    gen = torch.Generator().manual_seed(0)
    n = 5000
    key = key_words(torch.randint(0, 2**62, (n,), generator=gen).tolist())
    u = position_uniforms(key, torch.randint(0, 8, (n,), generator=gen), torch.randint(0, 2**31, (n,), generator=gen),
                          NoiseStream.DRAW)
    assert u.dtype == torch.float64 and bool(((u > 0) & (u < 1)).all())
    assert abs(u.mean().item() - 0.5) < 0.02                # 0.5 +- 5 sigma of a mean of 5000 uniforms


@pytest.mark.parametrize("field", ["stream", "position", "seq_index", "seed_low", "seed_high"])
def test_each_key_field_changes_the_uniform(field):
    n = 200
    positions, seqs, seeds = torch.arange(n), torch.zeros(n, dtype=torch.int64), [12345] * n
    base = position_uniforms(key_words(seeds), seqs, positions, NoiseStream.DRAW)
    stream = NoiseStream.DRAW
    if field == "stream":
        stream = NoiseStream.ACCEPT
    elif field == "position":
        positions = positions + n
    elif field == "seq_index":
        seqs = seqs + 1
    elif field == "seed_low":
        seeds = [12346] * n
    else:
        seeds = [12345 + 2**32] * n
    other = position_uniforms(key_words(seeds), seqs, positions, stream)
    assert not bool((other == base).any())
    assert len(set(base.tolist())) == n                        # distinct positions: distinct values


def test_the_seed_plus_sequence_index_is_not_the_next_sequence():
    """Seed s, sequence 1 and seed s + 1, sequence 0 are different keys."""
    positions = torch.arange(100)
    a = position_uniforms(key_words([7] * 100), torch.ones(100, dtype=torch.int64), positions, NoiseStream.DRAW)
    b = position_uniforms(key_words([8] * 100), torch.zeros(100, dtype=torch.int64), positions, NoiseStream.DRAW)
    assert not bool((a == b).any())


@pytest.mark.parametrize("vocab", [1, 2, 7, 10])
def test_token_uniforms_read_two_tokens_from_each_counter(vocab):
    """Token v: counter (position, seq_index, stream, v // 2), words 0-1 for even v and 2-3 for odd v."""
    key, seqs, positions = key_words([3, 2**64 - 1]), torch.tensor([0, 5]), torch.tensor([9, 2**31])
    got = token_uniforms(key, seqs, positions, vocab, NoiseStream.DRAFT)
    assert got.shape == (2, vocab)
    for row in range(2):
        for v in range(vocab):
            counter = torch.tensor([positions[row], seqs[row], int(NoiseStream.DRAFT), v // 2])
            out = philox4x32(counter, key[row])
            hi, lo = (out[0], out[1]) if v % 2 == 0 else (out[2], out[3])
            assert got[row, v].item() == words_to_uniform(hi, lo).item()
    first = position_uniforms(key, seqs, positions, NoiseStream.DRAFT)
    assert torch.equal(got[:, 0], first)                       # token 0 reads a position's one uniform
    assert torch.equal(token_uniforms(key, seqs, positions, vocab + 3, NoiseStream.DRAFT)[:, :vocab], got)
