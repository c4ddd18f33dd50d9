"""Client cancellation: a thread that asks Triton which in-flight requests were cancelled, and aborts them.

``is_cancelled()`` is asked under the serving lock, and only of requests still in flight: the output
thread removes a request under the same lock before sending its final response, after which Triton frees
the response factory that ``is_cancelled()`` reads (asking then crashes tritonserver). Each call is a
round trip to the server, so the lock is taken per request (the output thread, which needs it for every
response, never waits for a whole sweep), and a sweep asks at most ``CANCEL_CHECKS_PER_SWEEP`` of the
requests, those asked longest ago first.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from backend.serving.inflight import InFlight

CANCEL_CHECKS_PER_SWEEP = 16   # is_cancelled() calls per cancel_poll_interval_s, over all requests in flight


class CancelWatcher:
    def __init__(self, lock: threading.Lock, inflight: dict[str, InFlight], abort: Callable[[str], object],
                 poll_s: float):
        self._lock, self._inflight, self._abort, self._poll_s = lock, inflight, abort, poll_s
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llm-cancel-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed.wait(self._poll_s):
            self.sweep()

    def sweep(self) -> None:
        with self._lock:
            due = sorted((f for f in self._inflight.values() if not f.aborted), key=lambda f: f.cancel_checked_at)
        cancelled = []
        for f in due[:CANCEL_CHECKS_PER_SWEEP]:
            with self._lock:
                if self._inflight.get(f.engine_id) is not f or f.aborted:
                    continue
                f.cancel_checked_at = time.monotonic()
                try:
                    if f.request.is_cancelled():
                        f.aborted, f.stopped_by, f.stopped_at = True, "cancelled", time.monotonic()
                        cancelled.append(f.engine_id)
                except Exception:
                    pass
        for engine_id in cancelled:
            self._abort(engine_id)

    def stop(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
