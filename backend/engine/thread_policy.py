"""Intra-op threads per step on the CPU: more threads only where they measurably help.

On a small CPU shared with the rest of the server, an OpenMP barrier per op can make a second thread
slower for small steps (a descheduled thread stalls every op) while large steps gain from it. So the
engine picks, per step, between 1 thread and ``cpu_threads``, per bucket of step sizes (token counts,
powers of two), from a *probe*: ``PROBE_RUN`` consecutive steps with each count, the first step of each
run not counted (threads waking up), and the median seconds per step of the rest compared (one slow
step, the machine's noise, cannot decide it). ``cpu_threads`` is kept only when its median beats one
thread's by ``MARGIN`` (otherwise the second core stays free for the rest of the server). A bucket
probes at its first step and again after every ``RETRY_EVERY`` steps of it, since costs drift with the
machine's load. ``torch.set_num_threads`` costs well under a microsecond.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

PROBE_RUN = 6        # steps per thread count in a probe; the first of each run is not counted
RETRY_EVERY = 200    # steps of a bucket between probes
MARGIN = 0.03        # cpu_threads must be this much faster than 1 thread (median seconds per step)


def bucket(num_tokens: int) -> int:
    return 1 << max(0, num_tokens - 1).bit_length()


def probe_plan(first: int, second: int) -> list[tuple[int, bool]]:
    """(threads, counted) per step of a probe: a run of ``first``, then a run of ``second``."""
    return [(t, i > 0) for t in (first, second) for i in range(PROBE_RUN)]


def faster_count(samples: dict[int, list[float]], max_threads: int) -> int:
    """``max_threads`` when its median seconds per step beat one thread's by ``MARGIN``, else 1."""
    if not samples.get(1) or not samples.get(max_threads):
        return 1
    return max_threads if statistics.median(samples[max_threads]) < \
        (1.0 - MARGIN) * statistics.median(samples[1]) else 1


@dataclass
class _Bucket:
    choice: int = 1                                                         # threads between probes
    probed: bool = False
    since_probe: int = 0                                                    # steps since the last probe ended
    plan: list[tuple[int, bool]] = field(default_factory=list)              # the probe's remaining steps
    samples: dict[int, list[float]] = field(default_factory=dict)           # the probe's counted seconds
    counted: bool = False                                                   # the step under way is counted


@dataclass
class ThreadPolicy:
    max_threads: int
    _buckets: dict[int, _Bucket] = field(default_factory=dict)
    _current: int = 0                                                       # what torch was last set to

    @property
    def active(self) -> bool:
        return self.max_threads > 1

    def choose(self, num_tokens: int) -> int:
        """Threads for a step of ``num_tokens`` tokens (set on torch before the forward)."""
        if not self.active:
            return self.max_threads
        b = self._buckets.setdefault(bucket(num_tokens), _Bucket())
        if not b.plan and b.samples:                      # a probe just ended
            b.choice, b.samples, b.since_probe = faster_count(b.samples, self.max_threads), {}, 0
        if not b.plan and (not b.probed or b.since_probe >= RETRY_EVERY):
            other = self.max_threads if b.choice == 1 else 1
            b.plan, b.probed = probe_plan(other, b.choice), True
        if b.plan:
            threads, b.counted = b.plan.pop(0)
        else:
            threads, b.counted = b.choice, False
            b.since_probe += 1
        if threads != self._current:
            torch.set_num_threads(threads)
            self._current = threads
        return threads

    def observe(self, num_tokens: int, threads: int, seconds: float) -> None:
        """The seconds the step just chosen for took (counted only in a probe)."""
        b = self._buckets.get(bucket(num_tokens))
        if self.active and b is not None and b.counted:
            b.samples.setdefault(threads, []).append(seconds)
            b.counted = False
