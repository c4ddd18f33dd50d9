"""Keep tritonserver serving when one of its Python stubs dies: stop it, kill it after a grace, start it.

``Supervisor(server).run()`` (``cli/serve.py``'s main loop) looks at the server's stubs every ``poll_s``
(at most a second: ``cli/stub_watch.py``). On a death it sends tritonserver SIGTERM (its readiness turns
false at once and it stops taking requests), SIGKILLs its process group after ``grace_s`` (a dead stub's
requests never finish, so Triton's own shutdown would wait out its exit timeout), and starts it again on
the same ports. Killing the process ends every client stream (direct gRPC: UNAVAILABLE; the gateway maps
its upstream's failure to UNAVAILABLE, an SSE error event on HTTP); the requests in flight are lost.

Each poll also writes the liveness file that ``cli/liveness.py`` (the Kubernetes liveness probe) reads:
the state, the server's pid and its stubs' pids, so the probe fails when the watch stops reporting, a
restart failed, or a stub is dead and nothing acted. When tritonserver exits on its own (a graceful stop,
the engine watchdog's shutdown) ``run()`` returns its exit code, as the launcher did without the watch.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from cli.stub_watch import PROC, StubDeath, StubWatch

LIVENESS_ENV = "TRITON_LLM_LIVENESS_FILE"
DEFAULT_LIVENESS_FILE = Path("/tmp/triton-llm-liveness.json")
MAX_POLL_S = 1.0


def liveness_path_from_env(env=None) -> Path:
    raw = (os.environ if env is None else env).get(LIVENESS_ENV, "").strip()
    return Path(raw) if raw else DEFAULT_LIVENESS_FILE


@dataclass(frozen=True)
class Restart:
    """One restart: why, and how long each part took (seconds from the death's detection)."""

    reason: str
    stopped_s: float        # tritonserver gone (SIGTERM, then SIGKILL after the grace)
    ready_s: float          # ready again


class Supervisor:
    def __init__(self, server, *, poll_s: float = MAX_POLL_S, grace_s: float = 2.0, ready_timeout_s: float = 600.0,
                 liveness_path: Path | None = None, log: Callable[[str], None] = print, proc: Path = PROC):
        if not 0 < poll_s <= MAX_POLL_S:
            raise ValueError(f"poll_s: expected a number in (0, {MAX_POLL_S}], got {poll_s!r}")
        if grace_s < 0:
            raise ValueError(f"grace_s: must be >= 0, got {grace_s!r}")
        self.server = server
        self.poll_s, self.grace_s, self.ready_timeout_s = poll_s, grace_s, ready_timeout_s
        self.liveness_path = liveness_path
        self.log = log
        self.proc = proc                # /proc (a fake one in tests)
        self.watch: StubWatch | None = None
        self.restarts: list[Restart] = []
        self._stop = threading.Event()
        self._state = "starting"

    def request_stop(self) -> None:
        """The launcher is stopping the server: stubs exiting now are no reason to restart it."""
        self._stop.set()

    def resume(self) -> None:
        """Watch again after ``request_stop()``, once the server was started again by other means."""
        self._stop.clear()

    def arm(self) -> None:
        """Record the stubs of the (ready) server."""
        self.watch = StubWatch(self.server.proc.pid, self.proc)
        stubs = self.watch.arm()
        self._state = "serving"
        self.write_liveness()
        self.log(f"stub watch: {len(stubs)} Python stubs of tritonserver pid {self.server.proc.pid} "
                 f"({', '.join(sorted(s.model for s in stubs.values()))}), checked every {self.poll_s:g} s")

    def write_liveness(self, reason: str = "") -> None:
        if self.liveness_path is None:
            return
        proc = self.server.proc
        body = {"at": time.time(), "state": self._state, "reason": reason, "restarts": len(self.restarts),
                "server_pid": proc.pid if proc is not None else None,
                "stubs": sorted(self.watch.stubs) if self.watch is not None and self._state == "serving" else []}
        tmp = self.liveness_path.with_name(self.liveness_path.name + ".tmp")
        try:
            self.liveness_path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(body))
            tmp.replace(self.liveness_path)
        except OSError as e:
            self.log(f"stub watch: cannot write {self.liveness_path}: {e}")

    def check(self) -> list[StubDeath]:
        """One look: the stubs that died (none while the launcher is stopping the server)."""
        if self.watch is None or self._stop.is_set():
            return []
        return self.watch.check()

    def restart(self, deaths: list[StubDeath]) -> Restart:
        """SIGTERM, SIGKILL after ``grace_s``, start on the same ports, wait until ready, watch again."""
        t0 = time.monotonic()
        reason = "; ".join(map(str, deaths))
        self._state = "restarting"
        self.write_liveness(reason)
        self.log(f"stub watch: {reason}: restarting tritonserver (SIGTERM, SIGKILL after {self.grace_s:g} s)")
        self.server.stop(timeout=self.grace_s, signum=signal.SIGTERM)
        stopped = time.monotonic() - t0
        self.server.start()
        try:
            self.server.wait_ready(timeout=self.ready_timeout_s)
        except Exception:
            self._state = "failed"
            self.write_liveness(f"tritonserver did not become ready again after: {reason}")
            raise
        restart = Restart(reason, stopped, time.monotonic() - t0)
        self.restarts.append(restart)
        self.arm()
        self.log(f"stub watch: tritonserver ready again {restart.ready_s:.1f} s after the death was seen "
                 f"(stopped after {restart.stopped_s:.1f} s; restart {len(self.restarts)})")
        return restart

    def run(self) -> int:
        """Watch until tritonserver exits; returns its exit code. After ``request_stop()`` only waits for the
        exit (or for ``server.proc`` to be cleared by ``server.stop()``: then 0)."""
        if self.watch is None:
            self.arm()
        while True:
            proc = self.server.proc
            if proc is None:
                return 0
            code = proc.poll()
            if code is not None:
                return code
            deaths = self.check()
            if deaths:
                self.restart(deaths)
                continue
            if self._stop.is_set():
                if self._state != "stopping":
                    self._state = "stopping"
                    self.write_liveness()
                time.sleep(min(self.poll_s, 0.1))
                continue
            self.write_liveness()
            self._stop.wait(self.poll_s)
