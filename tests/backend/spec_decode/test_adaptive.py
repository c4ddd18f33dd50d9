"""Adaptive draft length: k from measured acceptance and step costs."""
from __future__ import annotations

from backend.spec_decode.adaptive import (
    PLAIN_EVERY,
    PROBE_EVERY,
    AdaptiveDraftLength,
    StepCosts,
    best_num_drafts,
    expected_accepted,
)


def test_expected_accepted_is_the_sum_of_running_products():
    assert expected_accepted([0.5, 0.5, 0.5], 3) == 0.5 + 0.25 + 0.125
    assert expected_accepted([1.0, 0.0, 1.0], 3) == 1.0


def test_best_k_trades_acceptance_against_cost():
    high = [0.9] * 4
    assert best_num_drafts(high, 4, step_share=1.0, cost_per_draft=0.05) == 4      # cheap and accepted: all
    assert best_num_drafts([0.05] * 4, 4, step_share=1.0, cost_per_draft=0.2) == 0  # rarely accepted: none
    # compute-bound: a draft token costs as much as a whole sequence's share of the step
    assert best_num_drafts([0.6] * 4, 4, step_share=1.0, cost_per_draft=1.0) == 0


def test_step_costs_per_bucket_plain_and_per_draft():
    costs = StepCosts()
    assert costs.estimate(1) is None and costs.plain_step_due(1)
    costs.observe(1, 0, 0.002)
    costs.observe(1, 4, 0.003)                                   # 4 drafts cost 1 ms more than a plain step
    assert costs.estimate(1) == (0.002, 0.00025)
    assert costs.estimate(3) is None                              # another bucket (4) is unmeasured
    assert not costs.plain_step_due(1)
    for _ in range(PLAIN_EVERY):
        costs.observe(1, 4, 0.003)
    assert costs.plain_step_due(1)                                # stale: measure a plain step again


def test_policy_starts_full_lowers_k_when_drafts_fail_and_reprobes():
    pol = AdaptiveDraftLength(4)
    assert pol.choose(1, 4, num_decoding=1) == 4                      # costs unknown: full k
    pol.observe_step(1, 0, 0.002)
    pol.observe_step(1, 4, 0.004)                                     # a draft costs a quarter of a step
    assert pol.choose(1, 4, num_decoding=1) == 4                      # prior acceptance is high
    for _ in range(60):
        pol.observe_verify(1, 4, 0)                                   # every first draft rejected
    ks = [pol.choose(1, 4, num_decoding=1) for _ in range(PROBE_EVERY)]
    assert ks[:-1] == [0] * (PROBE_EVERY - 1) and ks[-1] == 4          # off, then one probe with the full k
    assert AdaptiveDraftLength(4, enabled=False).choose(1, 3, 1) == 3
    pol.free([1])
    assert pol.choose(2, 4, num_decoding=1) == 0          # a new sequence starts from what the engine learned


def test_engine_wide_acceptance_carries_over_to_new_sequences():
    pol = AdaptiveDraftLength(4)
    pol.observe_step(1, 0, 0.002)
    pol.observe_step(1, 4, 0.0022)
    for seq in range(10):
        for _ in range(3):
            pol.observe_verify(seq, 4, 4)                  # every draft accepted
    assert min(pol.global_acceptance) > 0.9
    assert pol.choose(99, 4, num_decoding=1) == 4
