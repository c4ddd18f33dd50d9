"""Closed loops on several engines at once, stepped in turns of a few milliseconds on one thread.

The engines are not started: this driver calls ``engine.step()`` itself, giving each engine in turn a *slice* of
``slice_seconds`` on ``clock`` (the thread's CPU time by default), and keeps ``concurrency`` requests in flight on
each (a new one as soon as one finishes), every engine over the same items in the same order. Each engine's time is
the sum of its slices, less the time its output callbacks took (the client's work: a started engine hands outputs
to its emitter thread, off the loop), and every ``RequestRecord`` is stamped on that engine's own clock, so TTFT and
TPOT come out as the engine's time between its outputs.

Why: on a shared virtual machine the speed of a core can move by 30-50% over a fraction of a second, CPU time
included, and engines that take turns request by request (``closed_loop.run_engine_level``, one engine at a time)
see different spells: a per-round ratio of two identical engines moves by +-10-15% at batch 8. Slices of 20 ms put
every engine in every spell: two identical engines read 0.99-1.01 per cell, their per-round ratio with a standard
deviation of 2-3% (docs/benchmarks.md). What it does not remove: an
engine's own speed, which in some processes differs by 2-5% between identical engines for the whole process. What it
leaves out: the loop thread's waits for requests and the GIL (one thread here, as in a served engine with one CPU
thread), and what the other engines' slices leave in the caches (each slice starts with its weights evicted from L2
and partly from L3, alike for every engine).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench.harness.stats import RequestRecord

Records = list[RequestRecord | None]


class _Loop:
    """One engine's closed loop and its own clock: the time of its slices, less its callbacks'."""

    def __init__(self, name: str, engine: Any, items: Sequence[Any], concurrency: int, clock: Callable[[], float],
                 on_output: Callable[[str, Any], None] | None):
        self.name, self.engine, self.items, self.concurrency, self.clock = name, engine, items, concurrency, clock
        self.on_output = on_output
        self.records: dict[int, RequestRecord] = {}
        self.next = 0
        self.live = 0
        self.spent = 0.0                  # this engine's seconds before the slice now running
        self.slice_start: float | None = None
        self.client = 0.0                 # seconds of callbacks within the slice now running

    def now(self) -> float:
        """This engine's clock: its slices so far, callbacks left out."""
        return self.spent + (self.clock() - self.slice_start - self.client if self.slice_start is not None else 0.0)

    def top_up(self) -> None:
        while self.live < self.concurrency and self.next < len(self.items):
            i = self.next
            self.next += 1
            self.live += 1
            item = self.items[i]
            self.records[i] = rec = RequestRecord(start=self.now())
            self.engine.add_request(f"sliced-{self.name}-{id(self)}-{i}", item.prompt_ids, item.params,
                                    self._on_output(rec))

    def _on_output(self, rec: RequestRecord):
        def cb(out) -> None:
            entered = self.clock()
            if rec.record(out, self.now()):
                self.live -= 1
            if self.on_output is not None:
                self.on_output(self.name, out)
            self.client += self.clock() - entered
        return cb

    def done(self) -> bool:
        return self.next >= len(self.items) and not self.engine.has_work()

    def abort_all(self) -> None:
        """Abort the requests in flight and step the engine until it has freed them."""
        for i, rec in self.records.items():
            if rec.end is None:
                self.engine.abort(f"sliced-{self.name}-{id(self)}-{i}")
        self.next = len(self.items)
        while self.engine.has_work():
            self.engine.step()

    def run_slice(self, seconds: float) -> None:
        """Step the engine until ``seconds`` of its own time pass or it has nothing left to do."""
        self.slice_start, self.client = self.clock(), 0.0
        end = self.spent + seconds
        while self.now() < end:
            self.top_up()
            if not self.engine.has_work():
                break
            self.engine.step()
        self.spent = self.now()
        self.slice_start = None


def run_sliced(engines: Mapping[str, Any], items: Sequence[Any], concurrency: int, *, slice_seconds: float = 0.02,
               order: Sequence[str] | None = None, clock: Callable[[], float] = time.thread_time,
               on_output: Callable[[str, Any], None] | None = None,
               max_seconds: float = 3600.0) -> dict[str, tuple[Records, float]]:
    """Every engine in ``engines`` (not started) runs every item, ``concurrency`` at a time, in slices of
    ``slice_seconds`` taken in ``order`` (default: the mapping's); ``on_output(name, output)``, the client's work on
    each output, is not the engine's time. Returns per engine its records aligned with
    ``items`` and its own seconds. Raises ``RuntimeError`` when an engine has not finished after ``max_seconds``
    of its own time (its requests are aborted first, so that no block stays behind)."""
    if slice_seconds <= 0 or concurrency < 1:
        raise ValueError(f"run_sliced: slice_seconds must be > 0 and concurrency >= 1, got {slice_seconds}, "
                         f"{concurrency}")
    names = list(order or engines)
    if sorted(names) != sorted(engines):
        raise ValueError(f"run_sliced: order {names} must name each engine once ({sorted(engines)})")
    started = [n for n in names if getattr(engines[n], "loop_alive", lambda: False)()]
    if started:
        raise ValueError(f"run_sliced: engines {started} run their own loop thread; this driver steps them itself")
    loops = [_Loop(n, engines[n], items, concurrency, clock, on_output) for n in names]
    while True:
        pending = [lp for lp in loops if not lp.done()]
        if not pending:
            break
        for lp in pending:
            lp.run_slice(slice_seconds)
            if lp.spent > max_seconds and not lp.done():
                lp.abort_all()
                raise RuntimeError(f"run_sliced: {lp.name} did not finish within {max_seconds:.0f}s of its time")
    return {lp.name: ([lp.records.get(i) for i in range(len(items))], lp.spent) for lp in loops}
