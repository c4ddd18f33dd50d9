"""Measured step costs for the adaptive draft length (``adaptive.py``), per batch-size bucket.

``t(B)``: the seconds of a decode step without drafts over ``B`` sequences; ``x(B, k)``: what a step with drafts
costs beyond ``t(B)``, per speculating sequence, when its longest draft run is ``k`` (the proposer's time for those
drafts included). Both are exponential means of the engine's step times, kept per bucket
(``backend.core.buckets.bucket``) because neither is linear in ``B``: at small batches a verify step pays fixed
costs per speculating sequence, at large ones every extra token costs as much as any other. An unmeasured
``x(B, k)`` is interpolated linearly between measured lengths (``x(B, 0) = 0``) and grows in proportion to ``k``
above the longest, so an untried length errs cheap, is tried and then known; no length is taken as dearer than a
longer measured one (a step with more drafts does not cost less).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from backend.core.buckets import bucket


def ema(old: float | None, new: float, weight: float) -> float:
    """The exponential mean after one more observation (the first one is taken as it is)."""
    return new if old is None else old + weight * (new - old)


def extras_upto(measured: dict[int, float], k_max: int) -> list[float]:
    """``[x(1), ..., x(k_max)]`` from the measured lengths ``{k: x(k)}`` (not empty): exact where measured, else
    linear between neighbours (``x(0) = 0``), else in proportion to ``k`` above the longest; then each capped by
    every longer measured length's cost."""
    keys = sorted(measured)
    out = []
    for k in range(1, k_max + 1):
        below = [j for j in keys if j <= k]
        above = [j for j in keys if j > k]
        lo, x_lo = (below[-1], measured[below[-1]]) if below else (0, 0.0)
        if lo == k:
            out.append(x_lo)
        elif above:
            hi = above[0]
            out.append(x_lo + (measured[hi] - x_lo) * (k - lo) / (hi - lo))
        else:
            out.append(x_lo * k / lo)
    cap = None
    for k in reversed(keys):
        cap = measured[k] if cap is None else min(cap, measured[k])
        for j in range(min(k, k_max)):
            out[j] = min(out[j], cap)
    return out


@dataclass
class BucketCosts:
    """One bucket's estimates: ``plain`` (``t(B)``, None until measured), ``extra`` (``k -> x(B, k)``) and the steps
    with drafts since its last plain one."""

    plain: float | None = None
    extra: dict[int, float] = field(default_factory=dict)
    since_plain: int = 0


@dataclass
class StepCosts:
    """Step costs per ``bucket(B)``; ``weight`` is the exponential mean's weight of a new step."""

    weight: float
    buckets: dict[int, BucketCosts] = field(default_factory=dict)

    def at(self, num_seqs: int) -> BucketCosts:
        found = self.buckets.get(bucket(num_seqs))
        if found is None:
            found = self.buckets[bucket(num_seqs)] = BucketCosts()
        return found

    def observe_plain(self, num_seqs: int, seconds: float) -> None:
        b = self.at(num_seqs)
        b.plain = ema(b.plain, seconds, self.weight)
        b.since_plain = 0

    def observe_speculative(self, num_seqs: int, num_speculating: int, max_drafts: int, seconds: float) -> None:
        """A step over ``num_seqs`` sequences, ``num_speculating`` of them verifying at most ``max_drafts`` drafts,
        took ``seconds``; its extra is measured against the bucket's plain time once that is known."""
        b = self.at(num_seqs)
        b.since_plain += 1
        if b.plain is not None and num_speculating > 0:
            per_seq = max(0.0, seconds - b.plain) / num_speculating
            b.extra[max_drafts] = ema(b.extra.get(max_drafts), per_seq, self.weight)

    def snapshot(self) -> tuple[dict[int, float], dict[int, dict[int, float]]]:
        """``({bucket: t}, {bucket: {k: x}})`` (benchmarks, logs)."""
        rows = dict(sorted(self.buckets.items()))
        return ({b: c.plain for b, c in rows.items() if c.plain is not None},
                {b: dict(sorted(c.extra.items())) for b, c in rows.items() if c.extra})
