"""bench/harness/report.py: the printed rows and goal lines (other scripts read them), ratios, the plot, the JSON."""
from __future__ import annotations

import json

import pytest

from bench import bench_pipeline as bp
from bench.harness import report
from bench.harness.stats import RequestRecord, summarize


def _level(c, p_tok, e_tok, p_tpot, e_tpot):
    side = lambda tok, tpot: {"tok_per_s": tok, "tpot_ms": {"p50": tpot}, "ttft_ms": {"p50": 1.0}}  # noqa: E731
    return {"concurrency": c, "pipeline": side(p_tok, p_tpot), "engine": side(e_tok, e_tpot)}


def test_ratios_use_lowest_and_highest_levels(tmp_path):
    levels = [_level(1, 90, 100, 11.0, 10.0), _level(8, 400, 450, 20.0, 18.0), _level(32, 900, 1000, 30.0, 25.0)]
    r = bp.COMPARISON.ratios(levels)
    assert r["tpot_ratio"]["concurrency"] == 1 and r["tpot_ratio"]["ratio"] == pytest.approx(1.1)
    assert r["tpot_ratio"]["meets_goal"] is True
    assert r["throughput_ratio"]["concurrency"] == 32 and r["throughput_ratio"]["ratio"] == pytest.approx(0.9)
    assert r["throughput_ratio"]["meets_goal"] is True
    assert bp.COMPARISON.ratios([_level(1, 50, 100, 20.0, 10.0)])["tpot_ratio"]["meets_goal"] is False
    bp.COMPARISON.plot(levels, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ratio_fields_and_goal_lines_keep_their_names(capsys):
    r = bp.COMPARISON.ratios([_level(1, 90, 100, 11.0, 10.0), _level(32, 80, 100, 30.0, 25.0)])
    assert list(r["tpot_ratio"]) == ["concurrency", "pipeline_ms", "engine_ms", "ratio", "goal_max", "meets_goal"]
    assert list(r["throughput_ratio"]) == ["concurrency", "pipeline_tok_s", "engine_tok_s", "ratio", "goal_min",
                                           "meets_goal"]
    bp.COMPARISON.print_ratios(r)
    assert capsys.readouterr().out.splitlines() == [
        "TPOT at concurrency 1: pipeline 11.00 ms / in-process 10.00 ms = 1.100 (goal <= 1.1: met)",
        "throughput at concurrency 32: pipeline 80 tok/s / in-process 100 tok/s = 0.800 (goal >= 0.85: NOT met)"]
    assert report.Comparison().ratios([_level(1, 90, 100, 11.0, 10.0)])["tpot_ratio"] == {
        "concurrency": 1, "pipeline_ms": 11.0, "engine_ms": 10.0, "ratio": pytest.approx(1.1)}  # no goal, no verdict


def test_level_rows_print_as_before(capsys):
    ok = RequestRecord(start=0.0, events=[(0.1, 1), (0.2, 1), (0.3, 2)], end=0.3)
    bad = RequestRecord(start=0.0, end=0.05, error="boom")
    print(bp.COMPARISON.header())
    bp.COMPARISON.print_level({"concurrency": 8, "pipeline": summarize([ok, bad], 2.0),
                               "engine": summarize([ok], 1.0)})
    bp.COMPARISON.print_level({"concurrency": 1, "pipeline": summarize([ok], 0.5)})
    assert capsys.readouterr().out.splitlines() == [
        ("conc    done pipe tok/s eng tok/s ratio    TTFT p50/90/99 ms  ITL p50/90/99 ms TPOT p50 pipe/eng"
         "       E2E p50/90/99 ms"),
        ("   8   1/2           2         4  0.50    100.0/100.0/100.0    50.0/90.0/99.0   66.67/66.67 "
         "       300.0/300.0/300.0"),
        "     pipeline errors: 1 (first: boom)",
        ("   1   1/1           8         -     -    100.0/100.0/100.0    50.0/90.0/99.0   66.67/-     "
         "       300.0/300.0/300.0")]


def test_machine_and_json(tmp_path):
    m = report.machine((0.5, 0.4, 0.3), note="quiet")
    assert m["loadavg_before"] == (0.5, 0.4, 0.3) and len(m["loadavg_after"]) == 3 and m["note"] == "quiet"
    report.write_json(tmp_path / "sub" / "x.json", {"machine": m, "commit": report.git_commit()})
    assert json.loads((tmp_path / "sub" / "x.json").read_text())["machine"]["note"] == "quiet"


def test_goal_verdict_says_when_the_noise_cannot_tell():
    assert report.goal_verdict(2.1, (2.02, 2.2), 2.0) == "met"
    assert report.goal_verdict(1.9, (1.8, 1.98), 2.0) == "not met"
    assert report.goal_verdict(1.99, (1.9, 2.08), 2.0) == "not met at the median, within the noise"
    assert report.goal_verdict(2.01, (1.9, 2.08), 2.0) == "met at the median, within the noise"
    assert report.goal_verdict(2.01, None, 2.0) == "met at the median, within the noise"
