"""Adaptive draft length: k from measured acceptance and step costs."""
from __future__ import annotations

from backend.spec_decode.adaptive import (PROBE_EVERY, AdaptiveDraftLength, StepCostFit, best_num_drafts,
                                          expected_accepted)


def test_expected_accepted_is_the_sum_of_running_products():
    assert expected_accepted([0.5, 0.5, 0.5], 3) == 0.5 + 0.25 + 0.125
    assert expected_accepted([1.0, 0.0, 1.0], 3) == 1.0


def test_best_k_trades_acceptance_against_cost():
    high = [0.9] * 4
    assert best_num_drafts(high, 4, step_share=1.0, cost_per_draft=0.05) == 4      # cheap and accepted: all
    assert best_num_drafts([0.05] * 4, 4, step_share=1.0, cost_per_draft=0.2) == 0  # rarely accepted: none
    # compute-bound: a draft token costs as much as a whole sequence's share of the step
    assert best_num_drafts([0.6] * 4, 4, step_share=1.0, cost_per_draft=1.0) == 0


def test_step_fit_recovers_a_linear_cost():
    fit = StepCostFit()
    assert fit.coefficients() is None
    for n in [1, 5, 1, 5, 9, 2, 9]:
        fit.observe(n, 0.002 + 0.0005 * n)
    a, b = fit.coefficients()
    assert abs(a - 0.002) < 1e-9 and abs(b - 0.0005) < 1e-9


def test_policy_starts_full_lowers_k_when_drafts_fail_and_reprobes():
    pol = AdaptiveDraftLength(4)
    assert pol.choose(1, 4, num_decoding=1) == 4                      # costs unknown: full k (then half)
    for n in [1, 5, 3, 1, 5, 3]:
        pol.observe_step(n, 0.002 + 0.001 * n)                        # a verify token costs half a step
    assert pol.choose(1, 4, num_decoding=1) == 4                      # prior acceptance is high
    for _ in range(20):
        pol.observe_verify(1, 4, 0)                                   # every first draft rejected
    ks = [pol.choose(1, 4, num_decoding=1) for _ in range(PROBE_EVERY)]
    assert ks[:-1] == [0] * (PROBE_EVERY - 1) and ks[-1] == 4          # off, then one probe with the full k
    assert AdaptiveDraftLength(4, enabled=False).choose(1, 3, 1) == 3
    pol.free([1])
    assert pol.choose(1, 4, num_decoding=1) == 4                      # a new sequence starts optimistic again
