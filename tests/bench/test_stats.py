"""bench/harness/stats.py: the one percentile definition, per-request metrics, level summaries."""
from __future__ import annotations

import asyncio
import json
import math

import pytest

from bench.harness import stats
from bench.harness.closed_loop import sweep


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


def _records(ttfts_ms, tpots_ms, tokens=5):
    """Requests with the given TTFTs and TPOTs (one token per response, start at 0)."""
    out = []
    for ttft, tpot in zip(ttfts_ms, tpots_ms):
        first = ttft / 1e3
        out.append(stats.RequestRecord(start=0.0, events=[(first + k * tpot / 1e3, 1) for k in range(tokens)],
                                       end=first + (tokens - 1) * tpot / 1e3, finish_reason="length"))
    return out


def test_engine_and_pipeline_benchmarks_report_the_same_p50():
    """One percentile definition: the same samples give the same p50/p90 in both reports.

    An even count tells the definitions apart: nearest rank (bench_engine's old ``pct``) said 30 ms.
    """
    from bench import bench_engine

    recs = _records([40.0, 10.0, 30.0, 20.0], [4.0, 1.0, 3.0, 2.0])

    async def fixed(items, concurrency, level_seconds):  # a "side" that replays the records
        return list(recs), 1.0

    row, = asyncio.run(sweep({4: recs}, {"pipeline": fixed}, level_seconds=60, deadline=math.inf))
    engine = bench_engine.engine_result(recs, 1.0)
    pipeline = row["pipeline"]
    assert engine["ttft_p50_ms"] == pytest.approx(pipeline["ttft_ms"]["p50"]) == pytest.approx(25.0)
    assert engine["tpot_p50_ms"] == pytest.approx(pipeline["tpot_ms"]["p50"]) == pytest.approx(2.5)
    assert engine["ttft_p90_ms"] == pytest.approx(pipeline["ttft_ms"]["p90"]) == pytest.approx(37.0)
    assert engine["tpot_p90_ms"] == pytest.approx(pipeline["tpot_ms"]["p90"])
    assert engine["tokens"] == pipeline["output_tokens"] == 20
    assert engine["tok_per_s"] == pytest.approx(pipeline["tok_per_s"])


def test_engine_result_refuses_failed_requests():
    from bench import bench_engine

    recs = _records([10.0], [1.0]) + [stats.RequestRecord(start=0.0, end=1.0, error="no final output within 600s")]
    with pytest.raises(RuntimeError, match="1 of 2 requests failed"):
        bench_engine.engine_result(recs, 1.0)


def test_median_interval_takes_the_order_statistics_binomial_coverage_allows():
    # n = 7: [min, max] covers the median with 1 - 2/128 = 98.4%, [x_(2), x_(6)] only 87.5%
    xs = [7.0, 1.0, 6.0, 2.0, 5.0, 3.0, 4.0]
    assert stats.median_interval(xs, 0.9) == (1.0, 7.0)
    assert stats.median_interval(xs, 0.85) == (2.0, 6.0)
    # n = 21 at 0.9: j = 7 (coverage 0.922; j = 8 would give 0.811)
    assert stats.median_interval([float(i) for i in range(1, 22)], 0.9) == (7.0, 15.0)
    # too few values for the confidence asked: no interval rather than an overconfident one
    assert stats.median_interval([1.0, 2.0, 3.0, 4.0], 0.9) is None
    assert stats.median_interval([], 0.9) is None


def test_median_interval_covers_the_median_as_often_as_it_claims():
    import random
    rng = random.Random(5)
    for n in (7, 15, 21):
        hits = 0
        for _ in range(4000):
            lo, hi = stats.median_interval([rng.gauss(0.0, 1.0) for _ in range(n)], 0.9)
            hits += lo <= 0.0 <= hi
        # exact coverage: 0.984 (n = 7), 0.965 (15), 0.922 (21); never below what was asked
        assert 0.9 <= hits / 4000 <= 0.995
