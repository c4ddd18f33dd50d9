"""A Prometheus histogram kept as counters, for a metric observed many times per request.

Triton's histogram (``pb_utils.MetricFamily.HISTOGRAM``) takes one value per ``observe``, and each call is
a round trip to the server process (~20 us of CPU). For the inter-token latency, one
observation per generated token, that is ~1.3 ms of CPU per 64-token request. ``CountedHistogram``
instead counts values into its buckets locally (``add``: numpy, no round trip) and ``publish`` adds the
accumulated counts to three counter families named as a histogram's series are:

    <name>_bucket{le="..."}   cumulative: values <= le (and le="+Inf": all)
    <name>_sum                the sum of the values
    <name>_count              how many

so the text on the metrics port has the series a histogram would have, and PromQL reads them the same way
(``histogram_quantile(0.99, sum by (le) (rate(<name>_bucket[5m])))``); only the ``# TYPE`` line says
counter. ``publish`` costs one round trip per bucket whose count grew, plus two, however many values
were added since the last one; the llm model's telemetry thread runs it at most every ``period_s``.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np


def le_label(bound: float) -> str:
    """A bucket's upper bound as Prometheus clients write it (``0.01``, ``80.0``, ``+Inf``)."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


def bucket_counts(values, bounds: np.ndarray) -> np.ndarray:
    """How many ``values`` fall in each bucket ``(bounds[i-1], bounds[i]]``, the last one unbounded."""
    index = np.searchsorted(bounds, np.asarray(values, dtype=np.float64), side="left")
    return np.bincount(index, minlength=len(bounds) + 1)


class CountedHistogram:
    def __init__(self, pb_utils, name: str, description: str, labels: dict[str, str], buckets: Sequence[float]):
        if list(buckets) != sorted(set(buckets)):
            raise ValueError(f"buckets of {name}: must be strictly increasing, got {list(buckets)}")
        kind = pb_utils.MetricFamily.COUNTER
        self.name = name
        self.bounds = np.asarray(buckets, dtype=np.float64)
        self.families = [pb_utils.MetricFamily(name=f"{name}_{part}", description=description, kind=kind)
                         for part in ("bucket", "sum", "count")]
        bucket, total, count = self.families
        self._buckets = [bucket.Metric(labels={**labels, "le": le_label(b)}) for b in [*buckets, float("inf")]]
        self._sum = total.Metric(labels=labels)
        self._count = count.Metric(labels=labels)
        self._pending = np.zeros(len(buckets) + 1, dtype=np.int64)
        self._pending_sum = 0.0
        self._lock = threading.Lock()

    def add(self, values) -> None:
        """Count ``values`` (seconds, say); published by the next ``publish``."""
        if len(values) == 0:
            return
        counts = bucket_counts(values, self.bounds)
        total = float(np.sum(values))
        with self._lock:
            self._pending += counts
            self._pending_sum += total

    def close(self) -> None:
        """Release the metrics, then their families (what is counted afterwards is not published)."""
        with self._lock:
            self._buckets, self._sum, self._count = [], None, None
            self.families = []

    def publish(self) -> int:
        """Add what was counted since the last call to the counters; returns how many values that was."""
        with self._lock:
            counts, total = self._pending, self._pending_sum
            if not counts.any() or self._sum is None:
                return 0
            self._pending = np.zeros_like(counts)
            self._pending_sum = 0.0
        cumulative = np.cumsum(counts)
        for metric, grew in zip(self._buckets, cumulative.tolist()):
            if grew:
                metric.increment(grew)
        self._sum.increment(total)
        n = int(cumulative[-1])
        self._count.increment(n)
        return n
