"""Outputs off the engine loop's critical path: one thread calls the ``on_output`` callbacks.

The loop thread resolves each output's callback (and its bookkeeping) and hands the pairs here; the
emitter calls them in the order received, so each request's outputs keep their order and its final
output stays last. Sending a response (Triton's decoupled sender, telemetry) is Python work of about
a millisecond; the forward of the next step releases the GIL (native ops, MKL), so on a machine with
a second core the two overlap instead of adding up.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)


class OutputEmitter:
    def __init__(self, name: str = "llm-engine-output"):
        self._queue: deque[tuple[Callable, object]] = deque()
        self._cv = threading.Condition()
        self._busy = False
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, calls: list[tuple[Callable, object]]) -> None:
        """Queue ``callback(output)`` calls (loop thread); returns at once."""
        if not calls:
            return
        with self._cv:
            self._queue.extend(calls)
            self._cv.notify()

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued call has run; False on timeout (or when called from a callback)."""
        if threading.current_thread() is self._thread:
            return False
        with self._cv:
            return self._cv.wait_for(lambda: not self._queue and not self._busy, timeout=timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Run what is queued, then end the thread."""
        self.flush(timeout)
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if threading.current_thread() is not self._thread:   # a callback may shut the engine down
            self._thread.join(timeout=timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._busy = False
                self._cv.notify_all()
                while not self._queue and not self._stopping:
                    self._cv.wait()
                if not self._queue:
                    return
                batch = list(self._queue)
                self._queue.clear()
                self._busy = True
            for callback, output in batch:
                try:
                    callback(output)
                except Exception:  # a broken consumer must not take the engine down
                    log.exception("on_output callback failed for %s", getattr(output, "request_id", "?"))
