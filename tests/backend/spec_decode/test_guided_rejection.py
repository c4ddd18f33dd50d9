"""Grammar-cut drafts keep the target's constrained distribution exactly.

Drafts drawn from a ``q`` that often proposes grammar-invalid tokens are cut the way the speculator
cuts them (``cut_drafts``) and verified with one bitmask row per verified position, as the engine
fills them. The emitted tokens must follow the *masked* target distribution (chi-square at p = 1e-4,
the harness of test_rejection.py). Dropping the first invalid draft of a ``q``-drawn proposal too
(cutting at it rather than after it) draws the next token from ``p`` instead of ``max(0, p - q)``:
the same test must catch that bias, and it must catch a bitmask applied to the first row only.
"""
from __future__ import annotations

import torch

from backend.core.sequence import Sequence
from backend.sampling.sampler import Sampler
from backend.spec_decode.speculator import cut_drafts
from contracts.sampling_params import SamplingParams
from tests.backend.spec_decode.test_rejection import P_LOGITS, VOCAB, Q, chi2, chi2_critical

N = 20000
ALLOWED = [{0, 1, 4, 5}, {1, 2, 3, 5}, set(range(VOCAB))]   # what the grammar admits at positions 0, 1, 2
# q_0 puts 0.65 on the tokens 2 and 3, which the grammar forbids at position 0


def mask_row(allowed: set[int]) -> int:
    word = sum(1 << t for t in allowed)
    return word - (1 << 32) if word >= 1 << 31 else word     # int32 two's complement


def masked_probs(j: int) -> torch.Tensor:
    logits = P_LOGITS[j].clone()
    logits[[t for t in range(VOCAB) if t not in ALLOWED[j]]] = float("-inf")
    return logits.softmax(-1)


def run(n: int, seed0: int, keep_invalid: bool = True, rows_masked: int | None = None):
    """n sequences proposing 2 drafts from q; cut, then verified with a bitmask row per position
    (row j after an invalid draft is unconstrained, as the manager leaves it). ``rows_masked``: mask
    only that many leading rows of each sequence (a broken fill)."""
    gen = torch.Generator().manual_seed(seed0)
    seqs, drafts, qs, logits, masks = [], [], [], [], []
    for i in range(n):
        d = [int(torch.multinomial(Q[0], 1, generator=gen)), int(torch.multinomial(Q[1], 1, generator=gen))]
        valid = 0 if d[0] not in ALLOWED[0] else (1 if d[1] not in ALLOWED[1] else 2)
        keep = cut_drafts(d, valid, sampled_from_q=True) if keep_invalid else valid
        seqs.append(Sequence(seq_id=i, request_id=f"r{i}", seq_index=0, prompt_token_ids=[0],
                             params=SamplingParams(temperature=1.0, seed=seed0 * 100003 + i)))
        drafts.append(d[:keep])
        qs.append(Q[:keep].clone())
        logits.append(P_LOGITS[:keep + 1])
        for j in range(keep + 1):
            masked = j <= valid and (rows_masked is None or j < rows_masked)
            masks.append(mask_row(ALLOWED[j]) if masked else -1)
    out = Sampler(VOCAB, seed=seed0).verify(torch.cat(logits), seqs, drafts, qs,
                                            torch.tensor(masks, dtype=torch.int32)[:, None])
    first = torch.tensor([t[0] for t in out.token_ids])
    second = torch.tensor([t[1] if len(t) > 1 else -1 for t in out.token_ids])
    return first, second, torch.tensor([d[0] if d else -1 for d in drafts])


def first_fits(first) -> bool:
    return chi2(torch.bincount(first, minlength=VOCAB).float(), masked_probs(0)) < chi2_critical(VOCAB - 1)


def second_fits(first, second, draft1) -> bool:
    sel = (second >= 0) & (first == draft1)
    assert int(sel.sum()) > 2000
    return chi2(torch.bincount(second[sel], minlength=VOCAB).float(), masked_probs(1)) < chi2_critical(VOCAB - 1)


def test_cut_drafts_keep_the_masked_target_distribution():
    first, second, draft1 = run(N, seed0=5)
    assert all(int(t) in ALLOWED[0] for t in first)
    assert first_fits(first) and second_fits(first, second, draft1)


def test_the_fit_test_catches_dropping_the_first_invalid_q_draft():
    first, _, _ = run(N, seed0=5, keep_invalid=False)
    assert all(int(t) in ALLOWED[0] for t in first)            # still valid, but biased
    assert not first_fits(first)


def test_the_fit_test_catches_a_bitmask_on_the_first_row_only():
    first, second, draft1 = run(N, seed0=5, rows_masked=1)
    sel = (second >= 0) & (first == draft1)
    assert any(int(t) not in ALLOWED[1] for t in second[sel])   # tokens the grammar forbids come out
    assert not second_fits(first, second, draft1)


def test_cut_drafts():
    assert cut_drafts([4, 5, 6], 3, True) == 3 and cut_drafts([4, 5, 6], 3, False) == 3
    assert cut_drafts([4, 5, 6], 1, True) == 2 and cut_drafts([4, 5, 6], 1, False) == 1
    assert cut_drafts([4, 5, 6], 0, True) == 1 and cut_drafts([4, 5, 6], 0, False) == 0
