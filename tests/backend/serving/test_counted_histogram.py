"""backend/serving/counted_histogram.py: a histogram's _bucket/_sum/_count series as counters, published in batches."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from backend.serving.counted_histogram import CountedHistogram, bucket_counts, le_label
from backend.serving.request_metrics import TOKEN_LATENCY_BUCKETS
from tests.helpers.triton_fakes import make_pb_utils

LABELS = {"model": "llm", "version": "1"}


def series(pb, name: str) -> dict[str, float | None]:
    """le (or "" for _sum/_count) -> value of one of the histogram's three families."""
    fam, = [f for f in pb.families if f.name == name]
    assert fam.kind == "counter"
    return {m.labels.get("le", ""): m.value for m in fam.metrics}


def reference(values, bounds) -> dict[str, int]:
    """What a Prometheus histogram would show: for each le, the values <= le."""
    return {le_label(b): sum(v <= b for v in values) for b in [*bounds, float("inf")]}


def test_buckets_hold_values_up_to_and_including_their_bound():
    assert bucket_counts([0.01, 0.0100001, 0.0, 5.0, 100.0], np.asarray([0.01, 0.05, 5.0])).tolist() == [2, 1, 1, 1]
    assert le_label(0.025) == "0.025" and le_label(80) == "80.0" and le_label(float("inf")) == "+Inf"


def test_published_series_are_those_of_a_histogram_of_every_value():
    pb = make_pb_utils()
    h = CountedHistogram(pb, "x_seconds", "test", LABELS, TOKEN_LATENCY_BUCKETS)
    rng = np.random.default_rng(0)
    first, second = rng.exponential(0.3, size=63).tolist(), rng.exponential(0.3, size=200).tolist()
    h.add(first)
    h.add([0.01])
    assert h.publish() == 64          # published in two batches: the counters add up
    h.add([])
    h.add(second)
    assert h.publish() == 200 and h.publish() == 0
    seen = first + [0.01] + second
    buckets = series(pb, "x_seconds_bucket")
    assert buckets == reference(seen, TOKEN_LATENCY_BUCKETS)
    assert series(pb, "x_seconds_count") == {"": len(seen)}
    assert series(pb, "x_seconds_sum")[""] == pytest.approx(sum(seen))
    assert all(m.labels["model"] == "llm" for f in pb.families for m in f.metrics)


def test_publish_without_new_values_makes_no_round_trip():
    pb = make_pb_utils()
    h = CountedHistogram(pb, "x_seconds", "test", LABELS, [0.1, 1.0])
    calls = []
    for fam in pb.families:
        for m in fam.metrics:
            m.increment = lambda v, calls=calls: calls.append(v)
    assert h.publish() == 0 and calls == []
    h.add([0.05, 0.05, 0.5])
    assert h.publish() == 3
    assert sorted(calls) == [0.6, 2, 3, 3, 3]     # le=0.1: 2, le=1.0: 3, +Inf: 3, sum, count


def test_concurrent_adds_and_publishes_lose_nothing():
    pb = make_pb_utils()
    h = CountedHistogram(pb, "x_seconds", "test", LABELS, [0.5])
    stop = threading.Event()

    def publisher():
        while not stop.is_set():
            h.publish()
    t = threading.Thread(target=publisher)
    t.start()
    for _ in range(2000):
        h.add([0.25, 0.75])
    stop.set()
    t.join()
    h.publish()
    assert series(pb, "x_seconds_bucket") == {"0.5": 2000, "+Inf": 4000}
    assert series(pb, "x_seconds_count") == {"": 4000}


def test_buckets_must_increase():
    with pytest.raises(ValueError, match="buckets of x"):
        CountedHistogram(make_pb_utils(), "x", "test", LABELS, [1.0, 0.5])
