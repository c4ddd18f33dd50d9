"""The grammar mask's native ops (backend/native/csrc/bitmask.cpp) against the torch reference
(``apply_token_bitmask``, then ``argmax``), and the sampler giving the same tokens with either."""
from __future__ import annotations

import pytest
import torch

from backend.core.sequence import Sequence
from backend.native import native_ops
from backend.sampling.bitmask_kernels import TORCH_KERNELS, BitmaskKernels
from backend.sampling.ops import apply_token_bitmask, unpack_bitmask
from backend.sampling.sampler import Sampler
from contracts.sampling_params import SamplingParams

BUILD = native_ops()
pytestmark = pytest.mark.skipif(not BUILD.available, reason=f"native ops unavailable: {BUILD.reason}")
INF = float("inf")
EOS = 3


def words_for(allowed: torch.Tensor) -> torch.Tensor:   # [rows, vocab] bool -> [rows, ceil(vocab / 32)] int32
    rows, vocab = allowed.shape
    padded = torch.zeros(rows, -(-vocab // 32) * 32, dtype=torch.int64)
    padded[:, :vocab] = allowed.long()
    return (padded.view(rows, -1, 32) << torch.arange(32)).sum(-1).to(torch.int64).add(2**31).remainder(2**32) \
        .sub(2**31).to(torch.int32)


def random_case(rows: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and a bitmask with every kind of row: random bits, all allowed (unguided), one token only,
    only EOS, none allowed, allowed tokens that are all -inf, ties at the maximum, bits past the vocabulary."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen)
    allowed = torch.rand(rows, vocab, generator=gen) < 0.3
    kinds = ["random", "all", "one", "eos", "none", "all_inf", "ties", "sparse"]
    for r in range(rows):
        kind = kinds[r % len(kinds)]
        if kind == "all":
            allowed[r] = True
        elif kind == "one":
            allowed[r] = False
            allowed[r, int(torch.randint(vocab, (1,), generator=gen))] = True
        elif kind == "eos":
            allowed[r] = False
            allowed[r, EOS] = True
        elif kind == "none":
            allowed[r] = False
        elif kind == "all_inf":
            logits[r, allowed[r]] = -INF
        elif kind == "ties":
            logits[r] = torch.randint(0, 3, (vocab,), generator=gen).float()
        elif kind == "sparse":
            allowed[r] = torch.rand(vocab, generator=gen) < 0.01
    bitmask = words_for(allowed)
    if vocab % 32:
        bitmask[:, -1] |= torch.tensor(-1 << (vocab % 32), dtype=torch.int32)   # set bits past the vocabulary
    return logits, bitmask


@pytest.mark.parametrize("vocab", [32, 37, 100, 4096, 4099])
@pytest.mark.parametrize("seed", range(3))
def test_native_mask_and_argmax_equal_torch(vocab, seed):
    logits, bitmask = random_case(16, vocab, seed)
    expected = apply_token_bitmask(logits.clone(), bitmask)
    before = logits.clone()
    masked = BUILD.ops.masked_logits(logits, bitmask)
    assert torch.equal(logits, before)                       # a copy: not written
    assert torch.equal(masked, expected)
    assert torch.equal(masked == -INF, ~unpack_bitmask(bitmask, vocab) | (logits == -INF))
    got = BUILD.ops.masked_argmax(logits, bitmask)
    assert torch.equal(logits, before)                       # not written
    assert got.dtype == torch.int64 and torch.equal(got, expected.argmax(dim=-1))


def test_masked_argmax_picks_the_one_allowed_token_and_eos():
    logits = torch.randn(3, 300)
    allowed = torch.zeros(3, 300, dtype=torch.bool)
    allowed[0, 299] = True                                   # the last token, in a partial word
    allowed[1, EOS] = True
    allowed[2, [5, 70]] = True
    logits[2, 5], logits[2, 70] = -5.0, -4.0                 # the allowed maximum is below the global one
    got = BUILD.ops.masked_argmax(logits, words_for(allowed)).tolist()
    assert got == [299, EOS, 70]


def test_native_ops_take_row_strided_views_and_refuse_bad_shapes():
    logits, bitmask = random_case(8, 100, 7)
    big = torch.randn(8, 160)
    big[:, :100] = logits
    view = big[:, :100]                                      # rows strided by 160
    expected = apply_token_bitmask(logits.clone(), bitmask)
    assert torch.equal(BUILD.ops.masked_argmax(view, bitmask), expected.argmax(dim=-1))
    assert torch.equal(BUILD.ops.masked_logits(view, bitmask), expected)
    with pytest.raises(RuntimeError, match="words cannot cover"):
        BUILD.ops.masked_argmax(torch.randn(2, 100), torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="rows"):
        BUILD.ops.masked_logits(torch.randn(2, 64), torch.zeros(3, 2, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="float32"):
        BUILD.ops.masked_argmax(torch.randn(2, 64, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.int32))


def test_kernels_choose_native_only_when_the_library_has_the_ops():
    assert BitmaskKernels.of(BUILD.ops).native is BUILD.ops
    assert BitmaskKernels.of(None) == TORCH_KERNELS
    assert BitmaskKernels.of(object()) == TORCH_KERNELS
    logits, bitmask = random_case(8, 70, 3)
    for kernels in (BitmaskKernels.of(BUILD.ops), TORCH_KERNELS):
        assert torch.equal(kernels.masked_argmax(logits, bitmask),
                           apply_token_bitmask(logits.clone(), bitmask).argmax(dim=-1))
        assert torch.equal(kernels.masked_copy(logits, bitmask), apply_token_bitmask(logits.clone(), bitmask))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sampler_tokens_are_the_same_with_native_and_torch_masks(temperature):
    """Greedy rows (the masked-argmax path) and seeded sampled rows draw the same tokens either way, and
    every token is one the grammar allows."""
    vocab = 200
    logits, bitmask = random_case(8, vocab, 11)
    rows = [0, 1, 2, 3, 6]                                  # rows that allow at least one finite token
    logits, bitmask = logits[rows], bitmask[rows].contiguous()
    seqs = [Sequence(seq_id=i, request_id=f"r{i}", seq_index=0, prompt_token_ids=[1, 2],
                     params=SamplingParams(max_tokens=4, temperature=temperature, seed=i)) for i in range(len(rows))]
    outs = []
    for kernels in (BitmaskKernels.of(BUILD.ops), TORCH_KERNELS):
        sampler = Sampler(vocab, seed=0, bitmask_kernels=kernels)
        outs.append(sampler.sample(logits, sampler.build_batch(seqs, grammar_bitmask=bitmask)).token_ids)
    assert torch.equal(outs[0], outs[1])
    allowed = unpack_bitmask(bitmask, vocab)
    assert all(allowed[r, t] for r, t in enumerate(outs[0].tolist()))


def test_masked_argmax_treats_nan_as_torch_does():
    """A NaN at an allowed token wins (torch.argmax's rule); one at a masked token is masked away, as
    ``masked_fill`` (xgrammar's and the CUDA path) masks it (the CPU byte table adds -inf, which keeps a NaN)."""
    logits = torch.randn(2, 64)
    allowed = torch.zeros(2, 64, dtype=torch.bool)
    allowed[:, [3, 10, 40]] = True
    logits[0, 40] = float("nan")
    logits[1, 41] = float("nan")
    masked = logits.masked_fill(~allowed, -INF)
    assert BUILD.ops.masked_argmax(logits, words_for(allowed)).tolist() == masked.argmax(dim=-1).tolist()
    assert masked.argmax(dim=-1)[0] == 40
    copied = BUILD.ops.masked_logits(logits, words_for(allowed))
    assert torch.equal(copied.isnan(), masked.isnan()) and torch.equal(copied.nan_to_num(), masked.nan_to_num())


@pytest.mark.parametrize("vocab", [32, 37, 100, 4099])
def test_forced_tokens_native_and_torch_find_rows_that_allow_one_token(vocab):
    """The kernel: rows that allow exactly one token below the vocabulary give it (bits past the vocabulary do not
    count), rows that allow several or none give -1. ``all_forced``: the tokens only when every row is forced."""
    _, bitmask = random_case(16, vocab, 5)
    allowed = unpack_bitmask(bitmask, vocab)
    expected = [int(row.nonzero()[0]) if row.sum() == 1 else -1 for row in allowed]
    assert sum(t >= 0 for t in expected) >= 4 and -1 in expected
    assert BUILD.ops.forced_tokens(bitmask, vocab).tolist() == expected
    kernels = BitmaskKernels.of(BUILD.ops)
    assert kernels.all_forced(bitmask, vocab) is None                  # some rows allow several, or none
    rows = [i for i, t in enumerate(expected) if t >= 0]
    assert kernels.all_forced(bitmask[rows], vocab) == [expected[i] for i in rows]
    assert TORCH_KERNELS.all_forced(bitmask[rows], vocab) is None      # no check without the native kernel


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_a_step_every_grammar_forces_returns_the_forced_tokens_and_draws_as_sampling_would(temperature):
    """When every row's grammar allows one token the sampler returns those tokens without filtering or drawing,
    and every RNG (seeded rows' own, the engine's) ends where the full path leaves it: later draws are equal."""
    vocab = 300
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(1))
    allowed = torch.zeros(4, vocab, dtype=torch.bool)
    for r, t in enumerate([7, 40, 299, 128]):
        allowed[r, t] = True
    bitmask = words_for(allowed)
    params = [SamplingParams(max_tokens=4, temperature=temperature, seed=s, top_p=0.9) for s in (3, None, 5, None)]
    seqs = [Sequence(seq_id=i, request_id=f"r{i}", seq_index=0, prompt_token_ids=[1, 2], params=p)
            for i, p in enumerate(params)]
    states = []
    for kernels in (BitmaskKernels.of(BUILD.ops), TORCH_KERNELS):     # forced path; torch: the full draw
        sampler = Sampler(vocab, seed=0, bitmask_kernels=kernels)
        tokens = sampler.sample(logits, sampler.build_batch(seqs, grammar_bitmask=bitmask)).token_ids
        assert tokens.tolist() == [7, 40, 299, 128]
        after = sampler.build_batch(seqs)
        states.append(sampler.sample(torch.randn(4, vocab, generator=torch.Generator().manual_seed(2)), after)
                      .token_ids.tolist())
    assert states[0] == states[1]
