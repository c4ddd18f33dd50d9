"""Is the engine alive? A watchdog over the engine loop, and what the ``llm`` model does when it is not.

Triton 2.51 keeps a Python model READY for as long as it is loaded: an exception from ``execute()``
fails that request only, and even a dead stub process leaves ``/v2/models/llm/ready`` and
``/v2/health/ready`` at 200 (checked: after ``kill -9`` of the llm stub both stay 200 while every
request fails with ``Stub process 'llm_0_0' is not healthy``). Readiness turns false when the server
starts shutting down. So when the engine is gone, the ``llm`` model (1) logs why, (2) ends every
in-flight request with an error and rejects new ones, and (3) with ``engine_unhealthy_action:
shutdown`` (the default) sends tritonserver SIGTERM: it stops reporting ready at once, drains what is
left and exits, and the orchestrator replaces the pod, as vLLM's server exits when its engine dies.

Unhealthy means: the loop thread is not running, or there is work (requests waiting or running) and
the step counter has not moved for ``stall_timeout_s``.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)

UNHEALTHY_ACTIONS = ("shutdown", "fail_requests")


class EngineWatchdog:
    """Polls ``engine`` every ``interval_s``; calls ``on_unhealthy(reason)`` once when it is unhealthy.

    ``engine`` needs ``loop_alive()``, ``has_work()`` and ``stats().steps``.
    """

    def __init__(self, engine, on_unhealthy: Callable[[str], None], *, stall_timeout_s: float = 30.0,
                 interval_s: float = 0.5, clock: Callable[[], float] = time.monotonic):
        if stall_timeout_s <= 0 or interval_s <= 0:
            raise ValueError("engine_stall_timeout_s: must be > 0")
        self.engine = engine
        self.on_unhealthy = on_unhealthy
        self.stall_timeout_s = stall_timeout_s
        self.interval_s = interval_s
        self.clock = clock
        self.reason: str | None = None
        self._steps = -1
        self._progress_at = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> str | None:
        """One look at the engine: the reason it is unhealthy, or None."""
        if not self.engine.loop_alive():
            return "the engine loop thread is not running (it died)"
        now = self.clock()
        steps = self.engine.stats().steps
        if steps != self._steps or not self.engine.has_work():
            self._steps, self._progress_at = steps, now
            return None
        stalled = now - self._progress_at
        if stalled >= self.stall_timeout_s:
            return (f"the engine loop made no progress for {stalled:.1f} s while requests wait "
                    f"(engine_stall_timeout_s={self.stall_timeout_s:g})")
        return None

    def start(self) -> "EngineWatchdog":
        self._thread = threading.Thread(target=self._run, name="llm-engine-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                reason = self.check()
            except Exception:  # a racy read of the engine's state: look again next time, never die of it
                log.debug("llm: engine watchdog could not inspect the engine", exc_info=True)
                continue
            if reason is not None:
                self.reason = reason
                try:
                    self.on_unhealthy(reason)
                except Exception:
                    log.exception("llm: handling an unhealthy engine failed")
                return


def shutdown_server(reason: str) -> None:
    """Ask tritonserver (the stub's parent process) for its graceful shutdown: readiness turns false."""
    log.error("llm: asking tritonserver (pid %d) to shut down, so that /v2/health/ready turns false: %s",
              os.getppid(), reason)
    os.kill(os.getppid(), signal.SIGTERM)
