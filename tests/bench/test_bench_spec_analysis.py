"""bench_spec's arithmetic behind the batch-1 goals: speed-up from acceptance, measured costs and the prefill share."""
from __future__ import annotations

import itertools

import pytest

from bench.harness.spec_matrix import (
    decode_speedup_for,
    geometric_accepted,
    goal_analysis,
    goal_verdicts,
    overall_speedup,
    prefill_share,
    solve_increasing,
    turn_orders,
)


def test_geometric_accepted_and_its_inverse():
    assert geometric_accepted(0.5, 3) == 0.5 + 0.25 + 0.125
    a = solve_increasing(lambda v: geometric_accepted(v, 4), 0.79)
    assert geometric_accepted(a, 4) == pytest.approx(0.79, abs=1e-9)
    assert solve_increasing(lambda v: 1 + geometric_accepted(v, 1), 2.5) is None     # k = 1 yields at most 2


def test_analysis_predicts_speedup_and_what_would_reach_the_goal():
    adaptive = {"plain_step_ms": {1: 2.0}, "extra_ms_per_seq": {1: {1: 1.0, 4: 3.0}}}
    fixed = {"draft_tokens": 100, "mean_accepted_length": 1 + geometric_accepted(0.5, 4)}
    out = goal_analysis(adaptive, fixed, 4, 1.3)
    assert out["per_position_acceptance"] == pytest.approx(0.5)
    assert out["predicted_speedup"][1] == pytest.approx(1.5 / 1.5)
    assert out["predicted_speedup"][4] == pytest.approx((1 + geometric_accepted(0.5, 4)) / 2.5)
    assert out["max_extra_for_goal"][1] == pytest.approx(1.5 / 1.3 - 1)
    assert out["acceptance_for_goal"][1] == pytest.approx(0.95)   # 1 + a >= 1.3 * 1.5
    assert 0.5 < out["acceptance_for_goal"][4] < 1.0
    assert goal_analysis({"plain_step_ms": {}}, fixed, 4, 1.3) is None
    assert out["best_with_every_draft_accepted"] == pytest.approx(max(2 / 1.5, 5 / 2.5))


def test_the_prefill_share_raises_the_decode_speedup_a_goal_needs():
    assert prefill_share({"ttft_ms_p50": 10.0, "tpot_ms_p50": 0.5}, 81) == pytest.approx(0.2)
    assert prefill_share({"ttft_ms_p50": None, "tpot_ms_p50": 0.5}, 81) == 0.0
    assert overall_speedup(2.0, 0.0) == pytest.approx(2.0)
    assert overall_speedup(3.0, 0.2) == pytest.approx(1 / (0.2 + 0.8 / 3))
    need = decode_speedup_for(2.0, 0.2)
    assert overall_speedup(need, 0.2) == pytest.approx(2.0) and need == pytest.approx(8 / 3)
    assert decode_speedup_for(2.0, 0.5) is None          # half the time in prefill: 2x is out of reach
    adaptive = {"plain_step_ms": {1: 1.0}, "extra_ms_per_seq": {1: {4: 0.5}}}
    fixed = {"draft_tokens": 100, "mean_accepted_length": 1 + geometric_accepted(0.9, 4)}
    without, with_prefill = (goal_analysis(adaptive, fixed, 4, 2.0, p) for p in (0.0, 0.2))
    assert without["predicted_speedup"][4] == pytest.approx((1 + geometric_accepted(0.9, 4)) / 1.5)
    assert with_prefill["predicted_speedup"][4] == pytest.approx(overall_speedup(without["predicted_speedup"][4], 0.2))
    assert with_prefill["acceptance_for_goal"][4] > without["acceptance_for_goal"][4]
    assert goal_analysis(adaptive, fixed, 4, 2.0, 0.6)["acceptance_for_goal"][4] is None


def _cell(method, workload, temperature, c, ratio, ci, cpu=None, cpu_ci=None):
    return {"method": method, "workload": workload, "temperature": temperature, "concurrency": c, "ratio": ratio,
            "ratio_ci": ci, "cpu_ratio": cpu, "cpu_ratio_ci": cpu_ci}


def test_goal_verdicts_tell_met_from_within_the_noise():
    cells = [_cell("none", "repeat", 0.0, 1, 1.0, None),
             _cell("ngram", "repeat", 0.0, 1, 2.05, (1.96, 2.12), 2.1, (2.03, 2.2)),
             _cell("ngram", "mixed", 0.8, 8, 0.97, (0.93, 1.0)),
             _cell("ngram", "mixed", 0.0, 8, 1.2, (1.1, 1.3))]
    goal, floor = goal_verdicts(cells)
    assert goal["goal"].startswith("ngram repeat c=1 greedy") and goal["cell"] == "ngram repeat T=0 c=1"
    assert goal["verdict"] == "met at the median, within the noise" and goal["cpu_verdict"] == "met"
    assert floor["cell"] == "ngram mixed T=0.8 c=8" and floor["ratio"] == 0.97
    assert floor["verdict"] == "met at the median, within the noise" and floor["clearly_below"] == []
    cells[2] = _cell("ngram", "mixed", 0.8, 8, 0.9, (0.85, 0.94))       # its whole interval under the floor
    floor = goal_verdicts(cells)[-1]
    assert floor["verdict"] == "not met" and floor["clearly_below"] == ["ngram mixed T=0.8 c=8"]
    cells[2] = _cell("ngram", "mixed", 0.8, 8, 0.99, (0.96, 1.02))      # every interval at or above it
    assert goal_verdicts(cells)[-1]["verdict"] == "met"
    cells[2] = _cell("ngram", "mixed", 0.8, 8, 0.99, None)              # too few rounds for an interval
    assert goal_verdicts(cells)[-1]["verdict"] == "met at the median, within the noise"


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_turns_put_every_engine_in_every_position_and_after_every_other_equally(n):
    rows = turn_orders(n)
    assert all(sorted(row) == list(range(n)) for row in rows)
    for pos in range(n):                                   # each engine equally often in each position
        counts = [sum(row[pos] == e for row in rows) for e in range(n)]
        assert len(set(counts)) == 1
    follows = {}                                           # each ordered pair adjacent equally often
    for row in rows:
        for a, b in itertools.pairwise(row):
            follows[(a, b)] = follows.get((a, b), 0) + 1
    assert len(follows) == (n * (n - 1) if n > 1 else 0) and len(set(follows.values())) <= 1
    with pytest.raises(ValueError, match="turn_orders"):
        turn_orders(0)


def test_a_method_can_change_the_adaptive_policys_constants():
    from bench.bench_spec import method_spec
    assert method_spec("ngram") == ({"speculative_method": "ngram"}, {})
    assert method_spec("ngram/probe_budget=0/skip_idle=false") == \
        ({"speculative_method": "ngram"}, {"probe_budget": 0.0, "skip_idle": False})
    assert method_spec("draft/cost_weight=0.5")[1] == {"cost_weight": 0.5}
    for bad in ("ngram/window=3", "ngram-fixed/probe_budget=0", "none/probe_budget=0", "nope"):
        with pytest.raises(ValueError, match="--methods"):
            method_spec(bad)
