"""bench_spec's arithmetic behind the draft-model goal: speed-up from acceptance and measured costs."""
from __future__ import annotations

import pytest

from bench.bench_spec import draft_goal_analysis, geometric_accepted, solve_increasing


def test_geometric_accepted_and_its_inverse():
    assert geometric_accepted(0.5, 3) == 0.5 + 0.25 + 0.125
    a = solve_increasing(lambda v: geometric_accepted(v, 4), 0.79)
    assert geometric_accepted(a, 4) == pytest.approx(0.79, abs=1e-9)
    assert solve_increasing(lambda v: 1 + geometric_accepted(v, 1), 2.5) is None     # k = 1 yields at most 2


def test_analysis_predicts_speedup_and_what_would_reach_the_goal():
    adaptive = {"plain_step_ms": {1: 2.0}, "extra_ms_per_seq": {1: {1: 1.0, 4: 3.0}}}
    fixed = {"draft_tokens": 100, "mean_accepted_length": 1 + geometric_accepted(0.5, 4)}
    out = draft_goal_analysis(adaptive, fixed, 4, 1.3)
    assert out["per_position_acceptance"] == pytest.approx(0.5)
    assert out["predicted_speedup"][1] == pytest.approx(1.5 / 1.5)
    assert out["predicted_speedup"][4] == pytest.approx((1 + geometric_accepted(0.5, 4)) / 2.5)
    assert out["max_extra_for_goal"][1] == pytest.approx(1.5 / 1.3 - 1)
    assert out["acceptance_for_goal"][1] == pytest.approx(0.95)   # 1 + a >= 1.3 * 1.5
    assert 0.5 < out["acceptance_for_goal"][4] < 1.0
    assert draft_goal_analysis({"plain_step_ms": {}}, fixed, 4, 1.3) is None
