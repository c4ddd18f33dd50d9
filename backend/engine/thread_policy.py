"""Intra-op threads per step on the CPU: more threads only where they measurably help.

On a small CPU shared with the rest of the server, an OpenMP barrier per op can make a second thread
slower for small steps (a descheduled thread stalls every op) while large steps gain from it. So the
engine picks, per step, between 1 thread and ``cpu_threads``, per bucket of step sizes (token counts,
powers of two), from a *probe*: ``PROBE_RUN`` consecutive steps with each count, the first step of each
run not counted (threads waking up), and the median seconds per step of the rest compared (one slow
step, the machine's noise, cannot decide it). ``cpu_threads`` is kept only when its median beats one
thread's by ``MARGIN`` (otherwise the second core stays free for the rest of the server).

A bucket probes at its first step and again after ``RETRY_EVERY`` steps of it, since costs drift with the
machine's load. Each re-probe that confirms the choice doubles that interval (up to ``MAX_RETRY_EVERY``) and a
changed choice resets it, so a steady machine stops paying for probes (a batch-1 probe's two-thread steps take
twice a one-thread step: 3% of a 7-request run at 200 steps between probes). A bucket also re-probes at once
when the median of its last ``PROBE_RUN`` steps exceeds the chosen count's probe median ``SLOWDOWN`` times
while the choice is ``cpu_threads``: a second thread that loses its core to another process stalls every
barrier (a step of 0.3 ms can take 170 ms on a 2-core machine under a load of 5), so that choice must not last
once it goes wrong (the slow steps stand for its run of that probe). For the same reason a probe runs the
current choice first and cuts the other count's run short at its second counted step slower than ``ABORT``
times the choice's (keeping the choice: a count that slow could not have won).
A bucket's choice before its first probe is one thread, unless its steps are large (``macs_per_token`` x the
bucket's tokens >= ``WIDE_START_MACS``): such a bucket starts on ``cpu_threads`` and first probes at its first
scheduled re-probe (``RETRY_EVERY`` steps), its ``SLOWDOWN`` reference the median of its first ``PROBE_RUN``
steps. A prompt's chunks are few steps per bucket, often fewer than a probe, and a short batch-1 run pays the
probe's slower run in full: on the 300M-class model at 2 threads (``bench_formats``), 64-token prefills ran at 74
prompt tok/s behind a first one-thread run and 120 without; batch-1 decode of 32 tokens at 21.7 tok/s with the
probe and 23.1 on 2 threads throughout.
``torch.set_num_threads`` costs well under a microsecond.
"""
from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from backend.core.buckets import bucket
from backend.core.plan import ModelRunnerOutput, SchedulerOutput
from backend.engine.step_observer import StepObserver, StepStart

PROBE_RUN = 6        # steps per thread count in a probe; the first of each run is not counted
RETRY_EVERY = 200    # steps of a bucket between probes, at first and after a probe that changed the choice
MAX_RETRY_EVERY = 3200   # the interval doubles at each re-probe that confirms the choice, up to this
MARGIN = 0.10        # cpu_threads must be this much faster than 1 thread (median seconds per step)
SLOWDOWN = 1.5       # re-probe early when cpu_threads' recent median is this many times its probe median
ABORT = 1.5          # a probe's second run stops at two counted steps this many times slower than the first run
WIDE_START_MACS = 1 << 25   # a step of this many weight multiply-adds (~3 ms on one core) starts on cpu_threads


def matrix_elements(model: torch.nn.Module) -> int:
    """Elements of ``model``'s matrices (parameters and buffers of 2+ dimensions; packed int4 counts a byte per
    two weights): about the multiply-adds of one token's step, what ``ThreadPolicy.macs_per_token`` wants."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() for t in tensors if t.dim() >= 2)


def probe_plan(*counts: int) -> list[tuple[int, bool]]:
    """(threads, counted) per step of a probe: a run of each count in turn, its first step not counted."""
    return [(t, i > 0) for t in counts for i in range(PROBE_RUN)]


def faster_count(samples: dict[int, list[float]], max_threads: int) -> tuple[int, float | None]:
    """``max_threads`` when its median seconds per step beat one thread's by ``MARGIN``, else 1; and the
    chosen count's median (None: it has no samples)."""
    med = {t: statistics.median(v) for t, v in samples.items() if v}
    if 1 not in med or max_threads not in med:
        return 1, med.get(1)
    threads = max_threads if med[max_threads] < (1.0 - MARGIN) * med[1] else 1
    return threads, med[threads]


@dataclass
class _Bucket:
    choice: int = 1                                                         # threads between probes
    probed: bool = False
    since_probe: int = 0                                                    # steps since the last probe ended
    plan: list[tuple[int, bool]] = field(default_factory=list)              # the probe's remaining steps
    samples: dict[int, list[float]] = field(default_factory=dict)           # the probe's counted seconds
    reference: float | None = None                                          # the choice's probe median
    retry_every: int = RETRY_EVERY                                          # steps from a probe to the next
    recent: deque = field(default_factory=lambda: deque(maxlen=PROBE_RUN))  # seconds of the last steps after it
    pending: str = ""                                                       # the step under way: probe, steady


@dataclass
class ThreadPolicy:
    max_threads: int
    macs_per_token: int = 0                                                 # the model's weights a token multiplies
    _buckets: dict[int, _Bucket] = field(default_factory=dict)
    _current: int = 0                                                       # what torch was last set to

    @property
    def active(self) -> bool:
        return self.max_threads > 1

    def choose(self, num_tokens: int) -> int:
        """Threads for a step of ``num_tokens`` tokens (set on torch before the forward)."""
        if not self.active:
            return self.max_threads
        size = bucket(num_tokens)
        b = self._buckets.get(size)
        if b is None:
            wide = self.macs_per_token * size >= WIDE_START_MACS
            b = self._buckets[size] = _Bucket(choice=self.max_threads, probed=True) if wide else _Bucket()
        if not b.plan and b.samples:                      # a probe just ended
            choice, b.reference = faster_count(b.samples, self.max_threads)
            confirmed = b.since_probe >= b.retry_every and choice == b.choice    # a scheduled re-probe agreed
            b.retry_every = min(2 * b.retry_every, MAX_RETRY_EVERY) if confirmed else RETRY_EVERY
            b.choice, b.samples, b.since_probe = choice, {}, 0
            b.recent.clear()
        if not b.plan and (not b.probed or b.since_probe >= b.retry_every):
            other = self.max_threads if b.choice == 1 else 1
            b.plan, b.probed = probe_plan(b.choice, other), True
        if b.plan:
            threads, counted = b.plan.pop(0)
            b.pending = "probe" if counted else ""
        else:
            threads, b.pending = b.choice, "steady"
            b.since_probe += 1
        if threads != self._current:
            torch.set_num_threads(threads)
            self._current = threads
        return threads

    def observe(self, num_tokens: int, threads: int, seconds: float) -> None:
        """The seconds the step just chosen for took."""
        b = self._buckets.get(bucket(num_tokens))
        if not self.active or b is None:
            return
        if b.pending == "probe":
            b.samples.setdefault(threads, []).append(seconds)
            first = b.samples.get(b.choice)
            if threads != b.choice and first:
                limit = ABORT * statistics.median(first)
                if sum(s > limit for s in b.samples[threads]) >= 2:
                    b.plan.clear()                            # the other count lost already: end the probe
        elif b.pending == "steady":
            b.recent.append(seconds)
            if b.reference is None and len(b.recent) == PROBE_RUN:    # a wide start's first steps
                b.reference = statistics.median(b.recent)
            if b.choice != 1 and b.reference is not None and len(b.recent) == PROBE_RUN and \
                    statistics.median(b.recent) > SLOWDOWN * b.reference:
                b.samples, b.plan = {b.choice: list(b.recent)}, probe_plan(1)   # a probe of one thread only
        b.pending = ""


class ThreadObserver(StepObserver):
    """Sets the step's threads before its forward (``ThreadPolicy.choose``) and reports what the whole
    iteration took (``observe``): a second OpenMP thread that spins after the forward slows the Python
    around it, so scheduling and emitting count too. ``threads``: the current step's count."""

    def __init__(self, policy: ThreadPolicy):
        self.policy = policy
        self.threads = policy.max_threads

    def before(self, plan: SchedulerOutput) -> None:
        self.threads = self.policy.choose(plan.num_batched_tokens)

    def after(self, plan: SchedulerOutput, output: ModelRunnerOutput, start: StepStart) -> None:
        self.policy.observe(plan.num_batched_tokens, self.threads, time.perf_counter() - start.wall)
