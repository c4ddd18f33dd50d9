"""Per-request records and the statistics every benchmark reports from them.

One percentile definition for all of ``bench/``: linear interpolation between closest ranks
(numpy's default), so two reports on the same samples agree. A driver (``bench/harness/closed_loop.py``)
fills one ``RequestRecord`` per request; ``summarize`` turns a level's records into the JSON-ready
dict that reports print and write.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

QUANTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """What one request did, as the client saw it (times from ``time.perf_counter``)."""

    start: float
    events: list[tuple[float, int]] = field(default_factory=list)  # (arrival time, new output tokens)
    end: float | None = None
    finish_reason: str = ""
    num_input_tokens: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    error: str | None = None
    stream_cancelled: bool = False  # the stream did not close by itself after the final response

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.events)

    def record(self, out: Any, t: float) -> bool:
        """Takes one engine output (``backend.core.outputs.RequestOutput``) that arrived at ``t``; True when it is the
        request's last."""
        if out.new_token_ids:
            self.events.append((t, len(out.new_token_ids)))
            self.token_ids.extend(out.new_token_ids)
        if not out.request_finished:
            return False
        self.end = t
        self.finish_reason = str(getattr(out.finish_reason, "value", out.finish_reason) or "")
        if getattr(out, "error", None):
            self.error = str(out.error)
        return True


def percentile(xs: Sequence[float], q: float) -> float:
    """``q``-th percentile (0..100) with linear interpolation between closest ranks (numpy's default)."""
    if not xs:
        return math.nan
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def dist_ms(xs: Sequence[float]) -> dict[str, float | None]:
    """n, mean and p50/p90/p99 of seconds, in milliseconds (None when there is no sample)."""
    out = {"n": len(xs), "mean": 1e3 * sum(xs) / len(xs) if xs else math.nan}
    for q in QUANTILES:
        out[f"p{q}"] = 1e3 * percentile(xs, q)
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


def median_interval(xs: Sequence[float], confidence: float = 0.9) -> tuple[float, float] | None:
    """A distribution-free ``confidence`` interval for the median of what ``xs`` are independent draws of: the order
    statistics ``x_(j), x_(n+1-j)`` (1-based, ascending) for the largest ``j`` whose interval covers the median with
    probability ``1 - 2 P(B < j) >= confidence``, ``B ~ Binomial(n, 1/2)`` (the count of draws below the median).
    No assumption on the noise's shape; None when even ``[min, max]`` covers less (fewer than 5 values at 0.9)."""
    n, s = len(xs), sorted(xs)
    j, below = 0, 0                     # below: P(B < j + 1) * 2^n, grown one term at a time
    while j < n // 2:
        below += math.comb(n, j)
        if 1 - 2 * below / 2 ** n < confidence:
            break
        j += 1
    return (s[j - 1], s[n - j]) if j else None


def request_metrics(r: RequestRecord) -> dict[str, Any]:
    """TTFT, inter-token latencies, TPOT and end-to-end latency (seconds) of one finished request.

    ITL: the gap between two responses divided by the tokens in the later one, one sample per token.
    TPOT: (last token - first token) / (tokens - 1).
    """
    if not r.events:
        return {"ttft": None, "itl": [], "tpot": None, "e2e": None}
    first = r.events[0][0]
    itl: list[float] = []
    for (t0, _), (t1, n) in zip(r.events, r.events[1:]):
        itl.extend([(t1 - t0) / n] * n)
    tokens = r.tokens
    last = r.events[-1][0]
    return {"ttft": first - r.start, "itl": itl,
            "tpot": (last - first) / (tokens - 1) if tokens > 1 else None,
            "e2e": (r.end if r.end is not None else last) - r.start}


def summarize(records: Sequence[RequestRecord | None], seconds: float) -> dict[str, Any]:
    """Level statistics: throughput over the level's wall time, latency distributions over completed requests.

    ``None`` entries (requests a driver never sent: the level's time ran out) are skipped.
    """
    records = [r for r in records if r is not None]
    done = [r for r in records if r.error is None and r.events]
    ms = [request_metrics(r) for r in done]
    tokens = sum(r.tokens for r in records)
    return {
        "requests": len(records), "completed": len(done), "errors": sum(r.error is not None for r in records),
        "output_tokens": tokens, "seconds": seconds,
        "tok_per_s": tokens / seconds if seconds > 0 else None,
        "req_per_s": len(done) / seconds if seconds > 0 else None,
        "ttft_ms": dist_ms([m["ttft"] for m in ms]),
        "itl_ms": dist_ms([x for m in ms for x in m["itl"]]),
        "tpot_ms": dist_ms([m["tpot"] for m in ms if m["tpot"] is not None]),
        "e2e_ms": dist_ms([m["e2e"] for m in ms]),
        "first_error": next((r.error for r in records if r.error), None),
        "streams_cancelled": sum(r.stream_cancelled for r in records),
    }
