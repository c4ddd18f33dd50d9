"""The draft-length policies: FixedK, the adaptive policy's pure maths, its rules, and the size limits of the
policy modules (lines, constants, literals)."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from backend.spec_decode.adaptive import (AdaptiveConfig, AdaptiveDraftLength, best_num_drafts, expected_accepted,
                                          update)
from backend.spec_decode.policy import Candidate, FixedK, StepRecord, Verified
from backend.spec_decode.step_costs import StepCosts, ema, extras_upto

SPEC = Path(__file__).resolve().parents[3] / "backend" / "spec_decode"
POLICY_MODULES = ("policy.py", "adaptive.py", "step_costs.py")
MAX_POLICY_LINES, MAX_CONFIG_FIELDS = 350, 8


def stray_literals(source: str, config_class: str = "AdaptiveConfig") -> list[tuple[int, object]]:
    """Numeric literals other than 0 and 1 outside the config class (bools are not numbers here)."""
    tree = ast.parse(source)
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == config_class:
            inside.update(id(n) for n in ast.walk(node))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and type(n.value) in (int, float, complex) and n.value not in (0, 1)
            and id(n) not in inside]


def test_the_policy_fits_its_limits():
    lines = sum(len((SPEC / m).read_text().splitlines()) for m in ("adaptive.py", "step_costs.py"))
    assert lines <= MAX_POLICY_LINES, lines
    assert len(dataclasses.fields(AdaptiveConfig)) <= MAX_CONFIG_FIELDS
    for module in POLICY_MODULES:
        assert stray_literals((SPEC / module).read_text()) == [], module


def test_the_literal_check_finds_a_new_constant():
    assert stray_literals("WINDOW = 7\n") == [(1, 7)]
    assert stray_literals("def f(x):\n    return x * 0.5\n") == [(2, 0.5)]
    assert stray_literals("class AdaptiveConfig:\n    window: int = 7\n") == []
    assert stray_literals("x = [0, 1, 1.0, True]\n") == []


@pytest.mark.parametrize("field, value", [
    ("prior_acceptance", 0.0), ("prior_acceptance", 1.5), ("acceptance_weight", "x"), ("cost_weight", True),
    ("probe_budget", -0.5), ("plain_every", 1.5), ("skip_idle", "yes"),
])
def test_config_refuses_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        AdaptiveConfig(**{field: value})


def test_expected_accepted_is_the_sum_of_running_products():
    assert expected_accepted([0.5, 0.5, 0.5], 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert expected_accepted([0.9, 0.0, 1.0], 3) == pytest.approx(0.9)
    assert expected_accepted([0.9], 0) == 0.0


def test_best_k_trades_acceptance_against_cost():
    share = 1.0                                          # a sequence's share of a plain step
    assert best_num_drafts([0.9] * 4, share, [0.1, 0.2, 0.3, 0.4]) == 4
    assert best_num_drafts([0.1] * 4, share, [0.5, 1.0, 1.5, 2.0]) == 0       # nothing pays
    assert best_num_drafts([0.9, 0.1, 0.1], share, [0.2, 0.6, 0.9]) == 1      # only the first draft pays
    assert best_num_drafts([0.5], share, [0.5]) == 0     # (1 + 0.5) / 1.5 ties a plain step: no drafts
    assert best_num_drafts([], share, []) == 0


def test_update_observes_positions_up_to_the_first_rejection():
    a = [0.5, 0.5, 0.5, 0.5]
    update(a, 4, 1, 0.5)                                 # first accepted, second rejected, rest unobserved
    assert a == [0.75, 0.25, 0.5, 0.5]
    update(a, 2, 2, 1.0)                                 # both accepted (the bonus token is no draft)
    assert a == [1.0, 1.0, 0.5, 0.5]


def test_interpolation_errs_cheap_and_no_length_is_dearer_than_a_longer_one():
    assert extras_upto({2: 2.0}, 4) == [1.0, 2.0, 3.0, 4.0]      # x(0) = 0 below, in proportion to k above
    assert extras_upto({2: 2.0, 4: 3.0}, 4) == [1.0, 2.0, 2.5, 3.0]
    assert extras_upto({1: 1.0}, 3) == [1.0, 2.0, 3.0]           # in proportion to k above the longest
    assert extras_upto({1: 5.0, 4: 2.0}, 4) == [2.0, 2.0, 2.0, 2.0]   # a slow k = 1 capped by the cheaper k = 4
    assert ema(None, 3.0, 0.5) == 3.0 and ema(3.0, 1.0, 0.5) == 2.0


def test_step_costs_per_bucket():
    costs = StepCosts(weight=1.0)
    costs.observe_speculative(3, 2, 4, 0.010)            # no plain time yet: nothing to measure against
    assert costs.at(4).extra == {} and costs.at(4).since_plain == 1
    costs.observe_plain(3, 0.002)                        # bucket 4
    costs.observe_speculative(4, 2, 4, 0.010)
    assert costs.at(3).extra == {4: pytest.approx(0.004)}
    assert costs.at(8).plain is None                     # another bucket
    assert costs.snapshot() == ({4: 0.002}, {4: {4: pytest.approx(0.004)}})


def decode(policy, n=1, verified=(), seconds=0.001):
    policy.observe(StepRecord(n, seconds, True, list(verified)))


def warm(policy, n=1, plain=0.001, extra=0.0002, k=4):
    """Measure the bucket's plain step and its k-draft steps (sequences and class of their own)."""
    decode(policy, n, seconds=plain)
    decode(policy, n, [Verified(1000 + i, 99, k, k) for i in range(n)], seconds=plain + n * extra)


def test_a_bucket_measures_its_plain_step_then_its_drafts_then_chooses():
    p = AdaptiveDraftLength(4, AdaptiveConfig())
    cands = [Candidate(1, 0, 4)]
    assert p.choose(1, cands) == [0]              # t(1) unknown: a plain step
    decode(p, seconds=0.001)
    assert p.choose(1, cands) == [4]              # x(1, k) unknown: the cap
    decode(p, verified=[Verified(1, 0, 4, 4)], seconds=0.0012)
    assert p.choose(1, cands) == [4]              # every draft accepted, cheap: the cap
    for _ in range(10):                                  # rejected, and dearer
        decode(p, verified=[Verified(1, 0, 4, 0)], seconds=0.002)
    assert p.choose(1, cands) == [0]              # drafts rejected: plain decoding
    assert p.idle(1)
    p.free([1])
    assert not p.idle(1) and (1, 0) not in p._seqs


def test_probes_leave_k_zero_within_their_budget_and_switch_off():
    """A probe's extra (here as dear as a plain step) at budget 1/4: one round in 4."""
    for budget in (0.25, 0.0):
        p = AdaptiveDraftLength(4, AdaptiveConfig(probe_budget=budget, plain_every=0,
                                                  prior_acceptance=0.1))
        warm(p, extra=0.001)
        ks = [p.choose(1, [Candidate(1, 0, 4)])[0] for _ in range(8)]
        assert ks == ([0, 0, 0, 4, 0, 0, 0, 4] if budget else [0] * 8)
        assert p.idle(1) == (budget == 0)                # just probed: decided afresh next round
        p.choose(1, [Candidate(1, 0, 4)])
        assert p.idle(1)
        if budget:
            p.choose(1, [Candidate(1, 0, 4)])
            p.choose(1, [Candidate(1, 0, 4)])
            assert not p.idle(1)                         # a probe is due: looked up


def test_a_plain_step_every_plain_every_steps_with_drafts():
    p = AdaptiveDraftLength(4, AdaptiveConfig(plain_every=3, probe_budget=0))
    warm(p)
    seen = []
    for _ in range(8):
        k = p.choose(1, [Candidate(1, 0, 4)])[0]
        seen.append(k)
        decode(p, verified=[Verified(1, 0, k, k)] if k else [], seconds=0.0012 if k else 0.001)
    assert seen == [4, 4, 0, 4, 4, 4, 0, 4]              # warm's step and two more, then a plain one


def test_steps_with_a_prefill_chunk_are_not_timed():
    p = AdaptiveDraftLength(4)
    p.observe(StepRecord(1, 0.005, False))               # a prefill chunk
    assert p.costs.at(1).plain is None
    decode(p, seconds=0.001)
    assert p.costs.at(1).plain == 0.001


def test_acceptance_per_sequence_and_class_starts_from_the_class():
    p = AdaptiveDraftLength(2, AdaptiveConfig(prior_acceptance=0.5, acceptance_weight=0.5))
    decode(p, verified=[Verified(1, 3, 2, 2)])
    assert p.acceptance(1, 3) == [0.75, 0.75]
    assert p.acceptance(2, 3) == [0.75, 0.75]            # a new sequence: the class's engine-wide estimate
    assert p.acceptance(2, 5) == [0.5, 0.5]              # another class: the prior


def test_batch_size_changes_the_choice():
    p = AdaptiveDraftLength(4, AdaptiveConfig(probe_budget=0, plain_every=0, prior_acceptance=0.6))
    warm(p, n=1, plain=0.001, extra=0.0003)              # batch 1: drafts nearly free next to a step's share
    warm(p, n=32, plain=0.010, extra=0.0008)             # batch 32: a draft costs more than a share of the step
    assert p.choose(1, [Candidate(1, 0, 4)]) != [0]
    assert p.choose(32, [Candidate(i, 0, 4) for i in range(32)]) == [0] * 32


def test_fixed_k_always_proposes_the_cap():
    f = FixedK()
    assert f.choose(8, [Candidate(1, 0, 3), Candidate(2, 1, 0)]) == [3, 0]
    f.observe(StepRecord(1, 0.1, True))
    assert not f.idle(1)
