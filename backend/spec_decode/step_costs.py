"""Measured step costs of speculative decoding, for the adaptive draft length (backend/spec_decode/adaptive.py).

``t(B)``: a plain decode step over ``B`` sequences; ``x(B, k)``: everything a step with drafts costs beyond a plain
one, per speculating sequence, when the longest draft run is ``k``. Both are measured per batch-size bucket (powers
of two), ``x`` for each draft length (the longest draft run in the step), because neither is linear: a verify step
has fixed costs per speculating sequence, a draft model costs one forward per draft position whatever the batch, and
where a step is compute-bound (large batches) extra verify tokens cost as much as any other token and ``k`` drops,
possibly to 0. An unmeasured ``x(B, k)`` is interpolated linearly in ``k`` between measured lengths (``x(B, 0) =
0``), which errs low, so an untried length that looks best is tried and then known; above the longest measured
length it grows in proportion to ``k``; a bucket with no measurement borrows the nearest bucket's. No length is
taken as dearer than a longer one measured in its bucket (a step with more draft tokens does not cost less; a length
chosen rarely rests on few steps, and one slow step among them had left ``x(1, 1)`` at 0.55 ms where ``x(1, 2)``
read 0.08-0.17). A cost's estimate is the median of its last ``WINDOW`` observations (the minimum while it has fewer
than ``SETTLED``): on a shared machine other processes slow some steps down, and a step descheduled for a while says
nothing about speculation. A length measured only a few times is taken at no more than what the other lengths imply,
so one slow first step does not rule it out for good; so is a *stale* length, one not measured in the bucket's last
``STALE_LENGTH`` steps with drafts: a burst of slow steps (another process taking the caches) can leave a length's
median high, the policy then picks other lengths, and nothing would ever measure it again while those keep
speculation going. Its next measurement replaces its old ones.

To keep ``t`` current while everyone speculates, the engine runs one step without drafts when a
bucket's plain time is unknown or stale (``plain_step_due``: every ``PLAIN_EVERY`` speculative steps,
``PLAIN_EVERY_UNSETTLED`` at first, sooner where speculating gains little: ``plain_interval`` spaces them so that
they cost at most ``PLAIN_BUDGET`` of the throughput the policy expects from its drafts, every 8 steps with drafts
where they buy 5%, every 64 where they double it). ``x`` is a step's time less the plain estimate, so a plain
estimate left over from a slower spell of the machine makes drafts look cheaper *and* each saved step dearer: on
this VM a batch-8 plain step moved between ~1.0 and ~2.6 ms from one minute to the next, and at the end of greedy
``mixed`` at batch 8 in a full ``bench_spec.py`` matrix the policy held ``t(8)`` at 1.94 ms where ``none``'s steps
averaged 1.24 ms, and speculated at a loss (0.92x). Where drafts double throughput, an estimate that far off
changes nothing, and a plain step costs half a step; where they buy a few percent, it turns the choice, and a plain
step costs a few percent of one; the first ``SETTLED`` steps with drafts in a bucket then measure ``x`` at the
full ``k`` (their median: one of them alone can be a one-off, ``_extra_bucket``), so a bucket's costs are known
after four steps. The other way round, after ``STALE_AFTER`` plain steps
in a bucket without a step with drafts, every sequence drafts its full ``k`` for one step
(``remeasure_due``) and that measurement replaces the bucket's draft costs: costs measured while other
processes slowed the machine down (a long step is descheduled more often than a short one) would otherwise
keep speculation off for good, since nothing would ever measure them again. That step is every sequence's
probe at once, and the policy runs it no more often than its probe budget allows.

The decode steps right after a step with a prefill chunk are not observed (``COLD_STEPS``): most likely the
prefill's activations have pushed the weights out of the caches; the first step after it took 1.4-2 ms where its
steady state is 0.6 ms (demo target, batch 1). Those steps are a new request's first, which drafts its full ``k``,
so observing them charged every request's cold start to ``x(B, k_max)`` and kept the longest drafts from ever
looking worth it.

The engine passes the whole iteration's time (scheduling and emitting outputs are paid per step too), on the
loop thread's CPU clock when the step ran on one thread (the
shipped setting), wall time otherwise: the work a step does, not the time other processes took the core.
"""
from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field

from backend.core.buckets import bucket

WINDOW = 7                 # step-time observations kept per cost (bucket, draft length)
SETTLED = 3                # observations before a cost's estimate is their median rather than their minimum
PLAIN_EVERY = 64           # speculative steps in a bucket before its plain step time is measured again
PLAIN_EVERY_UNSETTLED = 8  # the same while the plain estimate rests on fewer than SETTLED steps
PLAIN_EVERY_MIN = 8        # ... and at least this many, however little speculating gains (plain_interval)
PLAIN_BUDGET = 0.008       # plain steps among steps with drafts cost at most this fraction of the expected throughput
STALE_AFTER = 128          # plain steps in a bucket without a step with drafts before its draft costs are re-measured
STALE_LENGTH = 16          # steps with drafts in a bucket since a length's last measurement before it is stale
COLD_STEPS = 2             # decode steps after a step with a prefill chunk whose times are not observed


def plain_interval(speedup: float | None) -> int:
    """Speculative steps between plain ones at a bucket where the policy expects its drafts to run a step ``speedup``
    times faster than a plain one (None: not known): a plain step in place of one with drafts loses ``1 - 1 / speedup``
    of a step, so every ``(1 - 1 / speedup) / PLAIN_BUDGET`` steps, within ``[PLAIN_EVERY_MIN, PLAIN_EVERY]``."""
    if speedup is None or speedup <= 1.0:
        return PLAIN_EVERY
    return max(PLAIN_EVERY_MIN, min(PLAIN_EVERY, math.ceil((1.0 - 1.0 / speedup) / PLAIN_BUDGET)))


def interpolate_extra(measured: dict[int, float], k: int) -> float:
    """``x(k)`` from the measured lengths: exact, else linear between neighbours (``x(0) = 0``), else
    in proportion to ``k`` above the longest measured one. ``measured`` must not be empty."""
    x = measured.get(k)
    if x is not None:
        return x
    keys = sorted(measured)
    hi = bisect.bisect_right(keys, k)                 # the shortest measured length above k (len: none)
    return between(keys, [measured[j] for j in keys], hi - 1, hi, k)


def between(keys: list[int], values: list[float], lo: int, hi: int, k: int) -> float:
    """``interpolate_extra`` for an unmeasured ``k`` from measured lengths ``keys`` (ascending, with ``values``):
    ``keys[lo]`` the nearest below ``k`` (``lo = -1``: none, ``x(0) = 0``), ``keys[hi]`` the nearest above
    (``hi = len(keys)``: none, ``x`` then grows in proportion to ``k``)."""
    k_lo, x_lo = (keys[lo], values[lo]) if lo >= 0 else (0, 0.0)
    if hi >= len(keys):
        return x_lo * k / k_lo
    return x_lo + (values[hi] - x_lo) * (k - k_lo) / (keys[hi] - k_lo)


@dataclass
class RecentTimes:
    """The last ``WINDOW`` observations of one cost. The estimate is their median, or their minimum while
    there are fewer than ``SETTLED`` (other processes only ever slow a step down, never speed it up)."""

    values: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    _estimate: float = 0.0     # kept up to date by ``add``: read every step, changed once per observation
    last_seen: int = 0         # the owner's count of observations when this cost was last observed

    def add(self, seconds: float) -> None:
        self.values.append(seconds)
        v = sorted(self.values)
        self._estimate = v[len(v) // 2] if self.settled else v[0]

    @property
    def settled(self) -> bool:
        return len(self.values) >= SETTLED

    def estimate(self) -> float:
        return self._estimate


@dataclass
class StepCosts:
    """Measured step costs per batch-size bucket: plain decode steps, and the extra per speculating
    sequence of a step with drafts, per draft length."""

    plain: dict[int, RecentTimes] = field(default_factory=dict)               # bucket -> step without drafts
    extra: dict[int, dict[int, RecentTimes]] = field(default_factory=dict)    # bucket -> {k: extra per sequence}
    since_plain: dict[int, int] = field(default_factory=dict)   # bucket -> speculative steps since a plain one
    since_speculative: dict[int, int] = field(default_factory=dict)   # bucket -> plain steps since one with drafts
    speculative_steps: dict[int, int] = field(default_factory=dict)   # bucket -> steps with drafts measured so far

    def observe_plain(self, num_seqs: int, seconds: float) -> None:
        b = bucket(num_seqs)
        times = self.plain.get(b)
        if times is None:
            times = self.plain[b] = RecentTimes()
        times.add(seconds)
        self.since_plain[b] = 0
        self.since_speculative[b] = self.since_speculative.get(b, 0) + 1

    def observe_speculative(self, num_seqs: int, num_speculating: int, max_drafts: int, seconds: float) -> None:
        """A step over ``num_seqs`` sequences, ``num_speculating`` of them verifying at most ``max_drafts``
        drafts, took ``seconds`` (its proposal included)."""
        b = bucket(num_seqs)
        self.since_plain[b] = self.since_plain.get(b, 0) + 1
        if b in self.plain and num_speculating > 0 and max_drafts > 0:
            per_seq = max(0.0, seconds - self.plain[b].estimate()) / num_speculating
            if self.remeasure_due(num_seqs):             # a re-measurement replaces what was known
                self.extra.pop(b, None)
            self.since_speculative[b] = 0
            by_k = self.extra.setdefault(b, {})
            seen = self.speculative_steps.get(b, 0)
            times = by_k.get(max_drafts)
            if times is None or seen - times.last_seen >= STALE_LENGTH:   # a stale length starts afresh
                times = by_k[max_drafts] = RecentTimes()
            times.add(per_seq)
            times.last_seen = self.speculative_steps[b] = seen + 1

    def plain_step_due(self, num_seqs: int, every: int = PLAIN_EVERY) -> bool:
        """No plain step measured at this bucket, or ``every`` speculative steps since the last one (the policy's
        ``plain_interval``; at most ``PLAIN_EVERY_UNSETTLED`` while the plain estimate rests on few steps)."""
        b = bucket(num_seqs)
        if b not in self.plain:
            return True
        if not self.plain[b].settled:
            every = min(every, PLAIN_EVERY_UNSETTLED)
        return self.since_plain.get(b, 0) >= every

    def remeasure_due(self, num_seqs: int) -> bool:
        """``STALE_AFTER`` plain steps at this bucket since its last step with drafts: its draft costs (or the
        nearest bucket's it borrows) may date from another load on the machine, and while they say drafts do
        not pay no step would ever measure them again."""
        return self.since_speculative.get(bucket(num_seqs), 0) >= STALE_AFTER

    def plain_seconds(self, num_seqs: int) -> float | None:
        t = self.plain.get(bucket(num_seqs))
        return None if t is None else t.estimate()

    def extra_seconds(self, num_seqs: int, k: int, optimistic: bool = True) -> float | None:
        """Estimated ``x(B, k)``; None while no bucket has a step with drafts measured. The definition, one length
        at a time; the policy reads all lengths at once through ``extra_seconds_upto`` (tested equal).

        ``optimistic``: a length measured fewer than ``SETTLED`` times, or stale (not measured in the bucket's
        last ``STALE_LENGTH`` steps with drafts), is taken at no more than what the other lengths imply, so that
        one slow first step or a burst of slow steps does not rule it out for good."""
        b = self._extra_bucket(num_seqs)
        if b is None:
            return None
        return self._extra(b, {j: t.estimate() for j, t in self.extra[b].items()}, k, optimistic)

    def extra_seconds_upto(self, num_seqs: int, k_max: int) -> tuple[list[float] | None, float | None]:
        """``[x(B, 1), ..., x(B, k_max)]`` (optimistic) and ``x(B, k_max)`` not optimistic: what ``extra_seconds``
        gives for each length, in one pass over the bucket's measurements (the policy asks for all of them every
        round, at batch 1 every step: per length, this was ~2/3 of the policy's time); ``(None, None)`` as
        ``extra_seconds``."""
        b = self._extra_bucket(num_seqs)
        if b is None:
            return None, None
        by_k = self.extra[b]
        seen = self.speculative_steps[b]
        keys = sorted(by_k)                        # the measured lengths, ascending, and their estimates
        vals = [by_k[j].estimate() for j in keys]
        extras = [0.0] * k_max
        i, cap = len(keys) - 1, float("inf")       # cap: the cheapest measured length longer than k
        while i >= 0 and keys[i] > k_max:
            cap = min(cap, vals[i])
            i -= 1
        for k in range(k_max, 0, -1):              # keys[i] <= k < keys[i + 1] (every longer key is in cap)
            if i >= 0 and keys[i] == k:            # measured: no dearer than a longer measured length
                extras[k - 1] = min(vals[i], cap)
                cap = min(cap, vals[i])
                i -= 1
            else:
                extras[k - 1] = min(between(keys, vals, i, i + 1, k), cap)
        pessimistic = extras[k_max - 1]
        if len(keys) > 1:                          # weakly measured lengths: no more than the others imply
            for idx, j in enumerate(keys):
                if j > k_max:
                    break
                t = by_k[j]
                if not t.settled or seen - t.last_seen >= STALE_LENGTH:   # the others' neighbours of j
                    extras[j - 1] = min(extras[j - 1], between(keys, vals, idx - 1, idx + 1, j))
        return extras, pessimistic

    def _extra_bucket(self, num_seqs: int) -> int | None:
        """The bucket whose draft costs stand for ``num_seqs``: its own once it has had ``SETTLED`` steps with
        drafts measured, else the nearest bucket that has; None while none has (the policy then drafts fully, to
        measure). A bucket's first step with drafts alone does not count: a one-off 10 ms first step (a first
        verify, a burst from another process) made drafts look 25 times dearer than they were and, with no other
        length to bound it, kept the policy at k = 0 for ~1,100 steps, until a re-measurement (greedy ``repeat``:
        once in ~15 runs the engine did not speculate for a whole round). A re-measurement later replaces the
        costs with one step, as before: it is budgeted like a probe, and three steps at the full k each time
        would cost ~4% at batch 32 where drafts do not pay."""
        b = bucket(num_seqs)
        if self.speculative_steps.get(b, 0) >= SETTLED and self.extra.get(b):
            return b
        known = [c for c, by_k in self.extra.items() if by_k and self.speculative_steps.get(c, 0) >= SETTLED]
        if not known:
            return None
        return min(known, key=lambda c: (abs(c.bit_length() - b.bit_length()), c))

    def _extra(self, b: int, measured: dict[int, float], k: int, optimistic: bool) -> float:
        by_k = self.extra[b]
        x = min([interpolate_extra(measured, k)] + [v for j, v in measured.items() if j > k])   # monotone in k
        if optimistic and k in by_k and len(measured) > 1 and \
                (not by_k[k].settled or self.speculative_steps[b] - by_k[k].last_seen >= STALE_LENGTH):
            x = min(x, interpolate_extra({j: v for j, v in measured.items() if j != k}, k))
        return x

    def snapshot(self) -> tuple[dict[int, float], dict[int, dict[int, float]]]:
        """(bucket -> plain step seconds, bucket -> {k: extra seconds per speculating sequence})."""
        return ({b: t.estimate() for b, t in sorted(self.plain.items())},
                {b: {k: t.estimate() for k, t in sorted(by_k.items())} for b, by_k in sorted(self.extra.items())})
