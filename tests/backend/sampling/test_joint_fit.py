"""Goodness of fit of the keyed draws on the joint law of consecutive verified tokens and of sibling sequences.

Per-position marginals cannot see noise that is reused; the joint law of (token t, token t + 1) of a sequence,
verified through ``Sampler.verify`` with one draft and finished by a plain step after a rejection, and the joint
law of the first tokens of sequences 0 and 1 of one request, can. A toy model: ``p_0`` at position 0, then
``p_1 = NEXT[x_0]``. Drafts are deterministic (n-gram-like, with the inverse-CDF rule) or drawn by a toy draft
model from its own ``q`` with the target's noise (the Gumbel rule). Each test uses 40,000 requests with fixed
seeds, a chi-square test at alpha = 0.001 on 16 cells, and its power against a shift of total variation 0.02 is
checked to be >= 0.99 (noncentrality >= 4 TV^2 N by Cauchy-Schwarz, whatever the shift's shape).

Wrong rules the test must reject, each as the draw kernels seen through a wrong key:
- noise reused across positions (every row keyed at position 0);
- noise indexed by the draw count of the step (a row's index among its sequence's rows in the call, not its
  position: the next step's first draw reuses this step's first noise);
- noise over the sorted, truncated candidate list (an inverse CDF over the top 3 tokens by probability; a sort
  alone is exact in law and shows in replay, not in a distribution);
- noise shared across the ``n`` sequences of a request (the sequence index left out of the key).
"""
from __future__ import annotations

import pytest
import torch
from scipy import stats

from backend.core.sequence import Sequence
from backend.sampling.keyed_draw import TORCH_DRAWS, DrawKernels, DrawKeys, DrawRule
from backend.sampling.keyed_noise import NoiseStream
from backend.sampling.ops import cdf_draw
from backend.sampling.sampler import Sampler
from contracts.sampling_params import SamplingParams

V = 4
P0 = torch.tensor([0.4, 0.3, 0.2, 0.1])
NEXT = torch.tensor([[0.45, 0.25, 0.2, 0.1], [0.3, 0.35, 0.15, 0.2], [0.25, 0.25, 0.4, 0.1], [0.4, 0.1, 0.2, 0.3]])
Q0 = torch.tensor([0.3, 0.4, 0.2, 0.1])            # the toy draft's law at position 0 (the Gumbel rule)
N_REQUESTS = 40_000
ALPHA = 1e-3
TV = 0.02


class ReusedAcrossPositions(DrawKernels):
    def draw(self, probs, keys, rule, stream=NoiseStream.DRAW):
        return TORCH_DRAWS.draw(probs, DrawKeys(keys.seeds, keys.seq_indices, [0] * len(keys)), rule, stream)


class IndexedByDrawCount(DrawKernels):
    def draw(self, probs, keys, rule, stream=NoiseStream.DRAW):
        seen: dict[tuple[int, int], int] = {}
        count = []
        for s, i in zip(keys.seeds, keys.seq_indices):
            count.append(seen.get((s, i), 0))
            seen[(s, i)] = count[-1] + 1
        return TORCH_DRAWS.draw(probs, DrawKeys(keys.seeds, keys.seq_indices, count), rule, stream)


class SortedTruncatedList(DrawKernels):
    def draw(self, probs, keys, rule, stream=NoiseStream.DRAW):
        top = probs.topk(3, dim=-1)
        u = TORCH_DRAWS.uniforms(keys, stream)[:, None]
        return top.indices.gather(1, cdf_draw(top.values, u)[:, None]).squeeze(1)


class SharedAcrossSequences(DrawKernels):
    def draw(self, probs, keys, rule, stream=NoiseStream.DRAW):
        return TORCH_DRAWS.draw(probs, DrawKeys(keys.seeds, [0] * len(keys), keys.positions), rule, stream)


def requests(n: int) -> list[list[Sequence]]:
    """n requests, two sequences each, sampled at temperature 1 with fixed seeds."""
    out = []
    for r in range(n):
        params = SamplingParams(temperature=1.0, seed=1_000_003 * r + 17, n=2, max_tokens=2)
        out.append([Sequence(2 * r + i, f"r{r}", i, [0], params) for i in range(2)])
    return out


def first_drafts(sampler: Sampler, seqs: list[Sequence], rule: DrawRule) -> list[int]:
    """Deterministic drafts for the inverse-CDF rule; the toy draft's race over ``Q0`` with the target's noise at
    position 0 for the Gumbel rule."""
    if rule is DrawRule.INVERSE_CDF:
        return [s.seq_id % V for s in seqs]
    return sampler.draws.draw(Q0.repeat(len(seqs), 1), sampler.keys(seqs), DrawRule.GUMBEL).tolist()


def joint_tables(draws: DrawKernels, rule: DrawRule) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts [V, V] of (x_0, x_1) over sequences 0, and of (x_0 of sequence 0, x_0 of sequence 1)."""
    sampler = Sampler(V, seed=0, draws=draws, rule=rule)
    reqs = requests(N_REQUESTS)
    seqs = [s for pair in reqs for s in pair]
    drafts = first_drafts(sampler, seqs, rule)
    logits = torch.stack([t for d in drafts for t in (P0.log(), NEXT[d].log())])
    verified = sampler.verify(logits, seqs, [[d] for d in drafts]).token_ids
    rejected = [i for i, t in enumerate(verified) if len(t) == 1]
    for i in rejected:
        seqs[i].output_token_ids.append(verified[i][0])
    rows = torch.stack([NEXT[verified[i][0]].log() for i in rejected])
    second = sampler.sample(rows, [seqs[i] for i in rejected]).token_ids.tolist()
    for i, t in zip(rejected, second):
        verified[i] = verified[i] + [t]
    within = torch.zeros(V, V)
    across = torch.zeros(V, V)
    for r in range(N_REQUESTS):
        a, b = verified[2 * r], verified[2 * r + 1]
        within[a[0], a[1]] += 1
        across[a[0], b[0]] += 1
    return within, across


def chi_square_p(counts: torch.Tensor, law: torch.Tensor) -> float:
    return float(stats.chisquare(counts.flatten().numpy(), (law.flatten() * counts.sum()).numpy()).pvalue)


WITHIN = P0[:, None] * NEXT                         # P(x_0 = a, x_1 = b)
ACROSS = P0[:, None] * P0[None, :]                  # independent siblings


def test_the_tests_power_against_a_small_shift():
    df = V * V - 1
    critical = stats.chi2.ppf(1 - ALPHA, df)
    assert stats.ncx2.sf(critical, df, 4 * TV ** 2 * N_REQUESTS) >= 0.99


@pytest.mark.parametrize("rule", [DrawRule.INVERSE_CDF, DrawRule.GUMBEL])
def test_the_keyed_draws_fit_the_joint_laws(rule):
    within, across = joint_tables(TORCH_DRAWS, rule)
    assert chi_square_p(within, WITHIN) > ALPHA
    assert chi_square_p(across, ACROSS) > ALPHA


@pytest.mark.parametrize("wrong", [ReusedAcrossPositions, IndexedByDrawCount, SortedTruncatedList,
                                   SharedAcrossSequences])
def test_each_wrong_rule_is_rejected(wrong):
    within, across = joint_tables(wrong(), DrawRule.INVERSE_CDF)
    assert min(chi_square_p(within, WITHIN), chi_square_p(across, ACROSS)) < ALPHA
