"""bench/stats.py: the one percentile definition, per-request metrics, level summaries."""
from __future__ import annotations

import json

import pytest

from bench import stats


def test_percentile_interpolates_like_numpy():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert stats.percentile(xs, 50) == 3.0
    assert stats.percentile(xs, 0) == 1.0 and stats.percentile(xs, 100) == 5.0
    assert stats.percentile(xs, 90) == pytest.approx(4.6)
    assert stats.percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert stats.percentile([7.0], 99) == 7.0
    assert stats.percentile([], 50) != stats.percentile([], 50)  # nan


def test_dist_ms_reports_milliseconds_and_none_when_empty():
    d = stats.dist_ms([0.010, 0.020, 0.030])
    assert d["n"] == 3 and d["p50"] == pytest.approx(20.0) and d["mean"] == pytest.approx(20.0)
    assert stats.dist_ms([]) == {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None}


def test_request_metrics_split_multi_token_responses():
    r = stats.RequestRecord(start=10.0, events=[(10.5, 1), (10.7, 1), (11.1, 4)], end=11.2)
    m = stats.request_metrics(r)
    assert m["ttft"] == pytest.approx(0.5)
    assert m["itl"] == pytest.approx([0.2, 0.1, 0.1, 0.1, 0.1])  # 0.4 s over the 4 tokens of the last response
    assert m["tpot"] == pytest.approx(0.6 / 5)                   # (last - first) / (tokens - 1)
    assert m["e2e"] == pytest.approx(1.2)


def test_summarize_counts_tokens_errors_and_throughput():
    ok = stats.RequestRecord(start=0.0, events=[(0.1, 1), (0.2, 1), (0.3, 1)], end=0.3, finish_reason="length")
    failed = stats.RequestRecord(start=0.0, end=0.05, error="boom")
    s = stats.summarize([ok, failed], seconds=2.0)
    assert (s["requests"], s["completed"], s["errors"], s["output_tokens"]) == (2, 1, 1, 3)
    assert s["tok_per_s"] == pytest.approx(1.5) and s["req_per_s"] == pytest.approx(0.5)
    assert s["ttft_ms"]["p50"] == pytest.approx(100.0) and s["tpot_ms"]["p50"] == pytest.approx(100.0)
    assert s["first_error"] == "boom"
    json.dumps(s)  # JSON-ready (no NaN)
    assert stats.summarize([None, ok, None], seconds=2.0) == stats.summarize([ok], seconds=2.0)  # never sent
