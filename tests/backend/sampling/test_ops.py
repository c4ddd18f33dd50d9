"""Each sampling filter alone (backend/sampling/ops.py)."""
import math

import pytest
import torch

from backend.sampling.ops import (
    apply_bans,
    apply_min_p,
    apply_penalties,
    apply_presence_frequency_penalties,
    apply_repetition_penalty,
    apply_temperature,
    apply_token_bitmask,
    apply_top_k_top_p,
    apply_top_p,
    bitmask_penalty,
    cdf_draw,
    gather_logprobs,
    race_draw,
    row_argmax,
    token_counts,
    unpack_bitmask,
)

INF = float("inf")


def kept(logits):
    return (logits > -INF).tolist()


def test_bitmask_unpacks_all_32_bits():
    words = torch.tensor([[(1 << 31) | 0b101, 0b10], [-1, -1]], dtype=torch.int64).to(torch.int32)
    allowed = unpack_bitmask(words, vocab_size=40)
    assert allowed.shape == (2, 40)
    assert allowed[0].nonzero().flatten().tolist() == [0, 2, 31, 33]
    assert allowed[1].all()
    out = apply_token_bitmask(torch.zeros(2, 40), words)
    assert (out[0] > -INF).nonzero().flatten().tolist() == [0, 2, 31, 33] and (out[1] == 0).all()


def test_bitmask_byte_table_equals_unpacking_and_xgrammar():
    """The CPU path (a 0 / -inf penalty from a byte table) masks exactly what unpacking the bits does, and
    what xgrammar's own apply_token_bitmask_inplace does, for full and partly guided batches."""
    import xgrammar as xgr

    gen = torch.Generator().manual_seed(0)
    words = torch.randint(-2**31, 2**31 - 1, (6, 5), dtype=torch.int64, generator=gen).to(torch.int32)
    words[2] = -1                                               # an unguided row
    logits = torch.randn(6, 150, generator=gen)
    assert torch.equal(bitmask_penalty(words, 150) == 0, unpack_bitmask(words, 150))
    for rows in (slice(None), [0, 1, 2], [2]):
        expected = logits[rows].clone()
        xgr.apply_token_bitmask_inplace(expected, words[rows].contiguous())
        got = apply_token_bitmask(logits[rows].clone(), words[rows])
        assert torch.equal(got, expected.masked_fill(~unpack_bitmask(words[rows], 150), -INF))
        assert torch.equal(got, expected)


def test_bans():
    out = apply_bans(torch.zeros(2, 5), torch.tensor([0, 1, 1]), torch.tensor([4, 0, 2]))
    assert kept(out) == [[True, True, True, True, False], [False, True, False, True, True]]
    assert (apply_bans(torch.ones(1, 3), torch.tensor([], dtype=torch.int64),
                       torch.tensor([], dtype=torch.int64)) == 1).all()


def test_token_counts_ignore_padding():
    ids = torch.tensor([[1, 1, 3, 5], [0, 5, 5, 5]])  # 5 = vocab: padding
    assert token_counts(ids, 5).tolist() == [[0, 2, 0, 1, 0], [1, 0, 0, 0, 0]]


def test_repetition_penalty_hf_semantics():
    logits = torch.tensor([[2.0, -2.0, 3.0, -1.0]])
    seen = torch.tensor([[True, True, False, False]])
    out = apply_repetition_penalty(logits, seen, torch.tensor([2.0]))
    assert out.tolist() == [[1.0, -4.0, 3.0, -1.0]]  # positive divided, negative multiplied, unseen untouched


def test_presence_frequency_openai_semantics():
    out = apply_presence_frequency_penalties(torch.zeros(1, 4), torch.tensor([[0, 1, 3, 0]]),
                                             presence=torch.tensor([0.5]), frequency=torch.tensor([0.25]))
    assert out.tolist() == [[0.0, -0.75, -1.25, 0.0]]


def test_apply_penalties_prompt_only_counts_for_repetition():
    v = 4
    logits = torch.ones(1, v)
    prompt = torch.tensor([[0, v]])   # token 0 only in the prompt
    output = torch.tensor([[1, 1]])   # token 1 twice in the output
    out = apply_penalties(logits.clone(), prompt, output, torch.tensor([2.0]), torch.tensor([0.5]),
                          torch.tensor([1.0]))
    assert out.tolist() == [[0.5, 0.5 - 0.5 - 2.0, 1.0, 1.0]]
    out = apply_penalties(logits.clone(), None, output, None, torch.tensor([0.5]), None)
    assert out.tolist() == [[1.0, 0.5, 1.0, 1.0]]


def test_temperature():
    out = apply_temperature(torch.tensor([[1.0, -2.0], [1.0, -2.0]]), torch.tensor([0.5, 2.0]))
    assert out.tolist() == [[2.0, -4.0], [0.5, -1.0]]


def test_top_k_alone_and_off():
    logits = torch.tensor([[0.1, 3.0, 2.0, -1.0, 2.5], [0.1, 3.0, 2.0, -1.0, 2.5], [1.0, 1.0, 1.0, 0.0, 0.0]])
    out = apply_top_k_top_p(logits.clone(), torch.tensor([2, 5, 1]), None)
    assert kept(out) == [[False, True, False, False, True], [True] * 5, [True, True, True, False, False]]  # ties kept
    assert torch.equal(out[0, [1, 4]], logits[0, [1, 4]])


def test_top_p_alone():
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    logits = probs.log().repeat(4, 1)
    out = apply_top_k_top_p(logits.clone(), None, torch.tensor([0.45, 0.7, 0.85, 1.0]))
    assert kept(out) == [[False, True, False, False], [False, True, False, True],
                         [False, True, True, True], [True, True, True, True]]


def test_top_p_applies_to_the_top_k_renormalised_distribution():
    # top-2 of [0.4, 0.3, 0.2, 0.1] renormalises to [4/7, 3/7]; p = 0.5 < 4/7 keeps only the first.
    # (Without the top-k renormalisation, p = 0.5 would keep two tokens.)
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    out = apply_top_k_top_p(logits.clone(), torch.tensor([2]), torch.tensor([0.5]))
    assert kept(out) == [[True, False, False, False]]
    out = apply_top_k_top_p(logits.clone(), torch.tensor([2]), torch.tensor([0.6]))
    assert kept(out) == [[True, True, False, False]]


def top_p_by_sorting(logits, top_p):
    """Reference: sort ascending, drop tokens whose own + less likely mass is <= 1 - p."""
    srt, idx = logits.sort(dim=-1)
    drop = srt.softmax(-1).cumsum(-1) <= (1 - top_p)[:, None]
    drop[:, -1] = False
    return logits.scatter(1, idx, srt.masked_fill(drop, -INF))


def test_top_p_candidates_agree_with_sorting():
    """Few candidates push flat rows on to the larger sizes and the full vocabulary."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 300, generator=gen) * torch.tensor([0.3, 1.0, 3.0, 8.0, 0.1, 5.0])[:, None]
    top_p = torch.tensor([0.9, 0.5, 0.95, 0.7, 1.0, 0.3])
    want = kept(top_p_by_sorting(logits.clone(), top_p))
    for sizes in ((4,), (4, 32), (32, 64), (300,), ()):
        assert kept(apply_top_p(logits.clone(), top_p, candidate_sizes=sizes)) == want
    assert all(want[4])  # top_p = 1 keeps everything


def test_min_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = apply_min_p(probs.log().repeat(2, 1), torch.tensor([0.25, 0.0]))
    assert kept(out) == [[True, True, True, False], [True] * 4]  # 0.15 >= 0.125, 0.05 < 0.125


def test_gather_logprobs():
    logits = torch.tensor([[1.0, 2.0, 0.5], [0.0, 0.0, 3.0]])
    chosen, ids, lps = gather_logprobs(logits, torch.tensor([0, 2]), 2)
    ref = logits.log_softmax(-1)
    assert torch.allclose(chosen, torch.tensor([ref[0, 0], ref[1, 2]]))
    assert ids[0].tolist() == [1, 0] and ids[1, 0].item() == 2
    assert torch.allclose(lps, ref.gather(1, ids))
    assert gather_logprobs(logits, torch.tensor([0, 2]), 0)[1] is None


def test_cdf_draw_follows_p_and_never_draws_zero_probability_tokens():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5]]).repeat(2000, 1)
    u = torch.rand(2000, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    drawn = cdf_draw(probs, u)
    assert set(drawn.tolist()) == {1, 3}
    assert math.isclose((drawn == 1).float().mean().item(), 0.5, abs_tol=0.06)
    top = torch.full((1, 1), 1.0 - 2.0 ** -53, dtype=torch.float64)     # rounding past the last token: its argmax
    assert cdf_draw(torch.tensor([[0.25, 0.75, 0.0]]), top).item() == 1


def test_race_draw_follows_p_and_never_draws_zero_probability_tokens():
    p = torch.tensor([0.1, 0.0, 0.6, 0.3])
    u = torch.rand(20000, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    drawn = race_draw(p.repeat(20000, 1) * 7.0, u)                      # unnormalised rows: the same law
    freq = torch.bincount(drawn, minlength=4).double() / 20000
    assert freq[1] == 0 and torch.allclose(freq, p.double(), atol=0.015)


@pytest.mark.parametrize("rows", [1, 5, 33])
def test_row_argmax_is_torch_argmax_ties_nan_and_inf_included(rows):
    gen = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows, 4096, generator=gen)
    logits[0, [7, 300, 4000]] = 50.0                  # equal maxima: the first
    if rows > 1:
        logits[1, 9] = float("nan")                    # NaN is the maximum
        logits[1, 10] = float("inf")
    if rows > 2:
        logits[2] = float("-inf")                      # a fully masked row: index 0
        logits[3, 4095] = float("inf")
    assert row_argmax(logits) == logits.argmax(dim=-1).tolist()
    assert row_argmax(logits)[0] == 7
    assert row_argmax(logits.to(torch.float64)) == logits.argmax(dim=-1).tolist()   # other dtypes: torch's


