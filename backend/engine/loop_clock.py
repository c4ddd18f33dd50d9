"""Where the engine loop thread's time goes while it works: on a core, waiting for one, or blocked.

The loop thread runs the steps; every other thread of the process (the output thread, Triton's stub,
telemetry, metrics, a client's threads in-process) competes with it for the GIL, and every process on
the machine competes with it for the cores. ``LoopClock`` splits the wall time the loop spent in
``step()`` (``busy_s``, summed by the loop itself: two ``perf_counter`` calls a step) into

- ``cpu_s``: on a core (the thread's CPU time, from the kernel);
- ``runqueue_s``: runnable, waiting for a core (the kernel's ``/proc/self/task/<tid>/schedstat``);
- ``blocked_s`` = busy - cpu - runqueue: asleep inside a step: waiting for the GIL (each native op, each
  torch op and each xgrammar call releases it, and another Python thread may hold it when the loop
  wants it back), for a lock, or (``cpu_threads`` > 1) for OpenMP's other threads at a barrier.

The CPU and run-queue times are read from the kernel when ``total()`` is called, from any thread, so the
steps pay nothing for them; they are the thread's totals since it started, which also count the loop's
few microseconds between steps (idle waits are sleeps: neither). Where the kernel does not publish
``schedstat``, the CPU time comes from the thread's CPU clock and ``runqueue_s`` is None (then
``blocked_s`` also holds the run-queue wait).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class LoopTime:
    """Cumulative seconds of the loop thread since it started."""

    busy_s: float                 # wall time inside step()
    cpu_s: float                  # on a core
    runqueue_s: float | None      # runnable, waiting for a core (None: the kernel does not say)

    @property
    def blocked_s(self) -> float:
        """Asleep while busy (GIL, locks, OpenMP barriers); never negative (the readings are not atomic)."""
        return max(0.0, self.busy_s - self.cpu_s - (self.runqueue_s or 0.0))

    def since(self, earlier: LoopTime) -> LoopTime:
        """The seconds between two readings of the same thread."""
        rq = None if self.runqueue_s is None or earlier.runqueue_s is None else self.runqueue_s - earlier.runqueue_s
        return LoopTime(self.busy_s - earlier.busy_s, self.cpu_s - earlier.cpu_s, rq)


def parse_schedstat(text: str) -> tuple[float, float]:
    """``/proc/.../schedstat`` ("on-cpu-ns runqueue-ns timeslices") as (cpu seconds, run-queue seconds)."""
    fields = text.split()
    if len(fields) < 2:
        raise ValueError(f"schedstat: expected at least 2 fields, got {text!r}")
    return int(fields[0]) * 1e-9, int(fields[1]) * 1e-9


class LoopClock:
    """Built on the loop thread (``for_current_thread``); ``add_busy`` there, ``total`` from any thread."""

    def __init__(self, thread: threading.Thread):
        self._thread = thread
        self._path = f"/proc/self/task/{thread.native_id}/schedstat"
        self._last: LoopTime | None = None   # the last reading while the thread lived
        self.busy_s = 0.0

    @classmethod
    def for_current_thread(cls) -> LoopClock:
        return cls(threading.current_thread())

    def add_busy(self, seconds: float) -> None:
        self.busy_s += seconds

    def total(self) -> LoopTime | None:
        """The totals now; once the thread has ended, its last reading (``busy_s`` no longer moves either).
        None: this platform gives neither ``schedstat`` nor a per-thread CPU clock (or no reading was taken
        while the thread lived)."""
        busy = self.busy_s   # first: the kernel's counters below are then at least as recent
        if not self._thread.is_alive():
            return self._last
        try:
            with open(self._path) as f:
                cpu, rq = parse_schedstat(f.read())
        except (OSError, ValueError):
            try:   # a live thread only: its pthread id is valid
                cpu, rq = time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident)), None
            except (OSError, AttributeError):   # no per-thread CPU clock on this platform
                return None
        self._last = LoopTime(busy, cpu, rq)
        return self._last
