"""The rejection rule reproduces the target distribution (goodness of fit), and a wrong rule is caught.

``Sampler.verify`` runs on fixed logits rows for many independent sequences at once (each with its
own seed), with drafts drawn from a draft distribution ``q`` that differs from the target's ``p``.
The first emitted token must be distributed as ``p_0``, and the second (given the first equals the
first draft) as ``p_1``: checked with a chi-square test at p = 1e-4 on enough samples to catch a 2%
shift of probability mass. The same test must reject a rule that accepts drafts on argmax equality.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import backend.sampling.sampler as sampler_module
from backend.core.sequence import Sequence
from backend.sampling.rejection import acceptance_probs, host_rejection_rule, num_accepted, recovery_probs
from backend.sampling.sampler import Sampler
from contracts.sampling_params import SamplingParams

VOCAB = 6
N = 20000
P_LOGITS = torch.tensor([[1.2, 0.4, 0.0, -0.5, 0.9, 0.3],     # p_0 (temperature 1)
                         [0.1, 1.5, 0.2, 0.0, -1.0, 0.6],     # p_1, after draft 1
                         [0.0, 0.0, 2.0, 0.5, 0.5, -0.2]])    # p_2 (bonus after draft 2)
Q = torch.tensor([[0.05, 0.1, 0.4, 0.25, 0.1, 0.1],           # the draft's q_0, q_1: far from p
                  [0.3, 0.05, 0.05, 0.3, 0.2, 0.1]])


def chi2_critical(df: int, z: float = 3.719) -> float:
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def run_verify(n: int, seed0: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n sequences, each with 2 drafts drawn from q; returns (first tokens, second tokens or -1)."""
    sampler = Sampler(VOCAB, seed=seed0)
    gen = torch.Generator().manual_seed(seed0 + 1)
    seqs = [Sequence(seq_id=i, request_id=f"r{i}", seq_index=0, prompt_token_ids=[0],
                     params=SamplingParams(temperature=1.0, seed=seed0 * 100003 + i)) for i in range(n)]
    drafts = [[int(torch.multinomial(Q[0], 1, generator=gen)), int(torch.multinomial(Q[1], 1, generator=gen))]
              for _ in range(n)]
    logits = P_LOGITS.repeat(n, 1)
    out = sampler.verify(logits, seqs, drafts, [Q.clone() for _ in range(n)])
    first = torch.tensor([t[0] for t in out.token_ids])
    second = torch.tensor([t[1] if len(t) > 1 else -1 for t in out.token_ids])
    return first, second, torch.tensor([d[0] for d in drafts])


def fit_ok(first, second, draft1) -> bool:
    p = P_LOGITS.softmax(-1)
    ok0 = chi2(torch.bincount(first, minlength=VOCAB).float(), p[0]) < chi2_critical(VOCAB - 1)
    # given the first token was draft 1 and a second token came out, it must follow p_1
    sel = (second >= 0) & (first == draft1)
    ok1 = chi2(torch.bincount(second[sel], minlength=VOCAB).float(), p[1]) < chi2_critical(VOCAB - 1)
    return ok0 and ok1 and int(sel.sum()) > 2000


@pytest.fixture(params=["host", "tensor"])
def rule_path(request, monkeypatch):
    """Both implementations of the rule: on the host (the CPU's) and in tensor ops (other devices')."""
    if request.param == "tensor":
        monkeypatch.setattr(Sampler, "host_rule", staticmethod(lambda t: False))
    return request.param


def argmax_host_rule(probs, row_starts, drafts, uniforms, draft_probs=None):
    """A wrong rule on the host: a draft is accepted exactly when it is the target's argmax."""
    best = probs.argmax(axis=1)
    forced = np.ones_like(uniforms)
    for i, (s, d) in enumerate(zip(row_starts, drafts)):
        for j, t in enumerate(d):
            forced[i, j] = 0.0 if t == best[s + j] else 1.0
    accepted, last = host_rejection_rule(probs, row_starts, drafts, forced, None)
    return accepted, last


def test_speculative_sampling_reproduces_the_target_distribution(rule_path):
    assert fit_ok(*run_verify(N, seed0=7))


def test_the_fit_test_catches_a_wrong_acceptance_rule(rule_path, monkeypatch):
    def argmax_rule(draft_ids, target_probs, draft_probs):   # accept when the draft is the target's argmax
        best = target_probs[:, :-1].argmax(dim=-1)
        return (draft_ids == best).float()
    monkeypatch.setattr(sampler_module, "acceptance_probs", argmax_rule)
    monkeypatch.setattr(sampler_module, "host_rejection_rule", argmax_host_rule)
    assert not fit_ok(*run_verify(N, seed0=7))


def test_the_fit_test_sees_a_two_percent_shift():
    p = P_LOGITS.softmax(-1)[0]
    shifted = p.clone()
    shifted[0] += 0.02
    shifted[3] -= 0.02
    draws = torch.multinomial(shifted, N, replacement=True, generator=torch.Generator().manual_seed(3))
    assert chi2(torch.bincount(draws, minlength=VOCAB).float(), p) > chi2_critical(VOCAB - 1)


def test_greedy_rows_accept_exactly_the_argmax_run():
    logits = torch.tensor([[0.0, 3.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 5.0, 0.0]])
    seq = Sequence(seq_id=0, request_id="g", seq_index=0, prompt_token_ids=[0], params=SamplingParams(temperature=0.0))
    out = Sampler(3, seed=0).verify(logits, [seq], [[1, 0, 1]])
    assert out.token_ids == [[1, 0, 2]] and out.num_accepted == [2]            # third draft rejected: argmax 2
    out = Sampler(3, seed=0).verify(logits, [seq], [[1, 0, 2]])
    assert out.token_ids == [[1, 0, 2, 1]] and out.num_accepted == [3]         # all accepted, bonus argmax 1


def test_rule_pieces():
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]])
    q = torch.tensor([[[0.25, 0.25, 0.5]]])
    d = torch.tensor([[1]])
    assert acceptance_probs(d, p, q).tolist() == [[1.0]]                        # p/q = 2 -> 1
    assert acceptance_probs(torch.tensor([[2]]), p, q).tolist() == [[0.0]]
    assert num_accepted(torch.tensor([[1.0, 0.2, 1.0]]), torch.tensor([[0.5, 0.3, 0.1]]),
                        torch.tensor([3])).tolist() == [1]
    r = recovery_probs(torch.tensor([0]), torch.tensor([1]), torch.tensor([[2]]), p, q)
    assert torch.allclose(r, torch.tensor([[0.25, 0.25, 0.0]]))                 # max(0, p - q)
    r = recovery_probs(torch.tensor([0]), torch.tensor([1]), torch.tensor([[0]]), p, None)
    assert torch.allclose(r, torch.tensor([[0.0, 0.5, 0.0]]))                   # point mass removed


@pytest.mark.parametrize("k", [0, 3])
def test_a_sequence_without_drafts_samples_exactly_as_plain_sampling(k):
    seqs = [Sequence(seq_id=i, request_id=f"s{i}", seq_index=0, prompt_token_ids=[0],
                     params=SamplingParams(temperature=0.9, top_k=4, seed=11 + i)) for i in range(2)]
    logits = torch.randn(1 + (k + 1), VOCAB, generator=torch.Generator().manual_seed(0))
    plain = Sampler(VOCAB, seed=0).sample(logits[:1], seqs[:1]).token_ids.tolist()
    verified = Sampler(VOCAB, seed=0).verify(logits, seqs, [[], [1] * k])
    assert verified.token_ids[0] == plain


def run_point_mass_verify(n: int, seed0: int, drafts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """n sequences verifying the same point-mass drafts (n-gram): (first tokens, second tokens or -1)."""
    sampler = Sampler(VOCAB, seed=seed0)
    seqs = [Sequence(seq_id=i, request_id=f"r{i}", seq_index=0, prompt_token_ids=[0],
                     params=SamplingParams(temperature=1.0, seed=seed0 * 100003 + i)) for i in range(n)]
    out = sampler.verify(P_LOGITS.repeat(n, 1), seqs, [list(drafts) for _ in range(n)])
    return (torch.tensor([t[0] for t in out.token_ids]),
            torch.tensor([t[1] if len(t) > 1 else -1 for t in out.token_ids]))


@pytest.mark.parametrize("drafts", [[0, 1], [3, 5]])   # likely drafts, and unlikely ones (mostly recovered)
def test_point_mass_drafts_reproduce_the_target_distribution(drafts, rule_path):
    """Point-mass drafts (n-gram): the first token follows p_0, the second (after the first draft was accepted)
    p_1, on both paths."""
    p = P_LOGITS.softmax(-1)
    first, second = run_point_mass_verify(N, 5, drafts)
    assert chi2(torch.bincount(first, minlength=VOCAB).float(), p[0]) < chi2_critical(VOCAB - 1)
    sel = first == drafts[0]
    assert int(sel.sum()) > 1000
    assert chi2(torch.bincount(second[sel], minlength=VOCAB).float(), p[1]) < chi2_critical(VOCAB - 1)


def accept_every_draft(draws, drafts):
    """A wrong coupled rule: every draft accepted, then the bonus row's draw."""
    out, row = [], 0
    for d in drafts:
        out.append(list(d) + [draws[row + len(d)]])
        row += len(d) + 1
    return out


def test_the_point_mass_fit_test_catches_a_wrong_rule(monkeypatch):
    monkeypatch.setattr(sampler_module, "coupled_verify", accept_every_draft)
    first, _ = run_point_mass_verify(N, 5, [0, 1])
    assert chi2(torch.bincount(first, minlength=VOCAB).float(), P_LOGITS.softmax(-1)[0]) > chi2_critical(VOCAB - 1)


@pytest.mark.parametrize("with_q", [False, True])
def test_the_host_rule_equals_the_tensor_rule_bit_for_bit(with_q):
    """The host path gives the accepted counts and last-token distributions of ``num_accepted`` and
    ``recovery_probs`` for the same uniforms, with point-mass drafts and with draft distributions ``q`` (some
    sequences without one, some draws with ``q(d) = 0`` or ``p = q``)."""
    gen = torch.Generator().manual_seed(1)
    V = 50
    for trial in range(40):
        counts = torch.randint(0, 5, (4,), generator=gen).tolist()
        if not any(counts):
            counts[0] = 2
        rows = sum(counts) + 4
        probs = (torch.rand(rows, V, generator=gen) ** 4).softmax(-1) if trial % 3 else \
            torch.zeros(rows, V).scatter_(1, torch.randint(0, V, (rows, 1), generator=gen), 1.0)
        starts = [sum(c + 1 for c in counts[:i]) for i in range(4)]
        argmax = probs.argmax(-1)
        drafts = [[int(argmax[s + j]) if torch.rand(1, generator=gen) < 0.6 else int(torch.randint(0, V, (1,),
                   generator=gen)) for j in range(c)] for s, c in zip(starts, counts)]
        k = max(counts)
        qs = None
        if with_q:
            qs = [None if i == 1 else (torch.rand(c, V, generator=gen) ** 2).softmax(-1) for i, c in enumerate(counts)]
            if counts[0]:
                qs[0][0, drafts[0][0]] = 0.0                      # a draft q gave no mass
            if counts[2]:
                qs[2][0] = probs[starts[2]]                       # p == q: an all-zero residual
        u = torch.rand(4, k, generator=gen)
        acc, last = host_rejection_rule(probs.numpy(), starts, drafts, u.numpy(),
                                        None if qs is None else [q if q is None else q.numpy() for q in qs])
        idx = torch.tensor([[s + min(j, c) for j in range(k + 1)] for s, c in zip(starts, counts)])
        target, ids = probs[idx], torch.tensor([d + [0] * (k - len(d)) for d in drafts])
        q = sampler_module._padded_draft_probs(qs, ids, counts, V)
        n = torch.tensor(counts)
        expected = num_accepted(acceptance_probs(ids, target, q), u, n)
        assert acc == expected.tolist()
        assert torch.equal(torch.from_numpy(last), recovery_probs(expected, n, ids, target, q))
