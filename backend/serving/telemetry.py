"""What happens when a request finishes, off the engine loop: histograms, the log line, the spans.

The llm model's engine callback builds a ``FinishedRequest`` for each request's final output and
hands it to ``RequestTelemetry.submit`` (a non-blocking put). One telemetry thread then records the
metrics (each observation is a round trip to the server process), writes the JSON log line and,
when the request was traced, makes its spans; and, at most every ``period_s`` while requests finish,
it runs the periodic work it was given (none in the llm model). The queue is
bounded: if the thread ever falls that far behind, records are dropped and counted (``dropped``)
rather than slowing the engine.
"""
from __future__ import annotations

import functools
import json
import logging
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from backend.core.outputs import RequestStats
from contracts.sampling_params import SamplingParams
from tracing import trace_id_of

log = logging.getLogger(__name__)


@dataclass
class FinishedRequest:
    """A finished request as the llm model saw it."""

    model_name: str                        # the served checkpoint (gen_ai.request.model)
    engine_id: str
    client_id: str
    params: SamplingParams                 # as requested (the seed actually used is stats.seed)
    stats: RequestStats | None             # None when the engine never queued it
    finish_reason: str                     # request level, as the client sees it (stop-string stops are "stop")
    finish_reasons: Sequence[str] = ()     # per sequence
    stopped_by: str | None = None          # stop_string | cancelled | error (postprocess's stops) | stop_request (client)
    stopped_at: float | None = None        # time.monotonic() when the stop reached the llm model
    error: str | None = None
    prompt_sha256: str = ""
    num_prompt_tokens: int = 0
    output_sha256: Sequence[str] = ()      # per sequence, of its output token ids
    options: str = ""                      # postprocess's output options (JSON text)
    trace_context: str | None = None       # Triton's span context text (only when tracing is on)
    finished_wall: float = 0.0             # time.time() at the end
    wall_offset: float = 0.0               # time.time() - time.monotonic(), to place stats' times on the wall clock

    @property
    def trace_id(self) -> str | None:
        return trace_id_of(self.trace_context)

    @functools.cached_property
    def output_options(self) -> dict[str, Any] | None:
        """``options`` parsed, once for the log line and the spans ({} when empty, None when unreadable)."""
        if not self.options:
            return {}
        try:
            parsed = json.loads(self.options)
        except (ValueError, TypeError):
            return None
        return parsed if isinstance(parsed, dict) else None


Sink = Callable[[FinishedRequest], Any]


@functools.lru_cache(maxsize=1024)
def f32(x: float) -> float:
    """An FP32 ensemble input as the number the client sent (0.7, not 0.699999988079071). Cached: a request's
    six sampling floats take few distinct values, and numpy's shortest repr costs ~5 us each."""
    return float(str(np.float32(x)))


@dataclass
class RequestTelemetry:
    """Runs ``sinks`` (metrics, log, spans) for each submitted record on one background thread."""

    sinks: list[Sink]
    closers: list[Callable[[], Any]] = field(default_factory=list)   # run at shutdown (the tracer's flush)
    periodic: list[Callable[[], Any]] = field(default_factory=list)  # run at most every period_s while records
    period_s: float = 0.5                                            # come in, and on flush() / shutdown
    resources: tuple = ()          # objects kept alive with the telemetry (Triton metric families)
    max_pending: int = 10_000
    dropped: int = 0
    processed: int = 0
    cpu_seconds: float = 0.0       # CPU time this thread spent in the sinks (its own cost, measured)
    _queue: queue.Queue = field(init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._queue = queue.Queue(maxsize=self.max_pending)

    def start(self) -> "RequestTelemetry":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="llm-telemetry", daemon=True)
            self._thread.start()
        return self

    def submit(self, rec: FinishedRequest) -> None:
        try:
            self._queue.put_nowait(rec)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("telemetry queue full: %d finished requests not recorded", self.dropped)

    def _run(self) -> None:
        due = None   # when the periodic work is due: period_s after the first record since it last ran
        while True:
            try:
                rec = self._queue.get(timeout=None if due is None else max(0.0, due - time.monotonic()))
            except queue.Empty:
                self._run_periodic()
                due = None
                continue
            try:
                if rec is None:
                    return
                self.process(rec)
                now = time.monotonic()
                if due is None:
                    due = now + self.period_s
                elif now >= due:
                    self._run_periodic()
                    due = None
            finally:
                self._queue.task_done()

    def _run_periodic(self) -> None:
        start = time.thread_time()
        for work in self.periodic:
            try:
                work()
            except Exception:   # telemetry must never take serving down
                log.exception("telemetry: %s failed", getattr(work, "__name__", work))
        self.cpu_seconds += time.thread_time() - start

    def process(self, rec: FinishedRequest) -> None:
        start = time.thread_time()
        self._run_sinks(rec)
        self.cpu_seconds += time.thread_time() - start
        self.processed += 1

    def _run_sinks(self, rec: FinishedRequest) -> None:
        for sink in self.sinks:
            try:
                sink(rec)
            except Exception:   # telemetry must never take serving down
                log.exception("telemetry: %s failed for request %s", getattr(sink, "__name__", sink), rec.engine_id)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every submitted record is processed, then run the periodic work (tests, shutdown)."""
        done = threading.Event()

        def waiter():
            self._queue.join()
            done.set()
        threading.Thread(target=waiter, daemon=True).start()
        if not done.wait(timeout):
            return False
        self._run_periodic()
        return True

    def shutdown(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            self.flush(timeout)
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                pass
            self._thread.join(timeout)
            self._thread = None
        else:
            self._run_periodic()
        if self.processed:   # one line on stderr (the server log): what recording cost, measured
            print(f"telemetry: {self.processed} finished requests recorded, "
                  f"{1e6 * self.cpu_seconds / self.processed:.0f} us of CPU each on the telemetry thread",
                  file=sys.stderr, flush=True)
        for close in self.closers:
            try:
                close()
            except Exception:
                log.exception("telemetry: closing failed")
        self.closers = []
