"""Child processes of the launcher: stopped gracefully then killed, dying with their parent, waited for until
ready, used as context managers (start, wait until ready, stop on the way out)."""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable


def stop_process(proc: subprocess.Popen, signum: int, timeout: float) -> int | None:
    """``signum`` (a graceful stop), then SIGKILL of the process group after ``timeout`` seconds; the exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return proc.returncode


PR_SET_PDEATHSIG = 1   # linux/prctl.h


def die_with_parent(signum: int = signal.SIGTERM):
    """A ``preexec_fn``: the child gets ``signum`` when this process dies, SIGKILL included, so a killed launcher
    leaves no tritonserver or gateway holding its ports; None off Linux. The kernel sends it when the thread that
    started the child exits, so start children from one that lives as long as they should (the main thread)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)    # loaded before the fork: the child only calls into it
    parent = os.getpid()

    def preexec() -> None:
        if libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:      # the parent died before prctl: nobody will send the signal
            os.kill(os.getpid(), signum)

    return preexec


class ChildProcess:
    """A server child: ``start()``, ``wait_ready()`` and ``stop()``; ``with`` runs the first two and always the
    last, also when the child never becomes ready. ``proc`` is the running process (None before ``start``);
    ``name``, ``ready_state`` and ``error`` word and raise what ``wait_until`` reports."""

    proc: subprocess.Popen | None = None
    name = "child"                          # the process, as errors name it
    ready_state = "ready"                   # what being ready is called in errors
    error: type[Exception] = RuntimeError

    def wait_until(self, ready: Callable[[], bool], timeout: float, interval: float) -> None:
        """Poll ``ready()`` every ``interval`` seconds until it holds; raise ``error`` naming the child, with
        ``tail_note()``, when it was never started, exits first, or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None:
                raise self.error(f"{self.name} not started")
            code = self.proc.poll()
            if code is not None:
                raise self.error(f"{self.name} exited with code {code} before becoming {self.ready_state}"
                                 f"{self.tail_note()}")
            if ready():
                return
            time.sleep(interval)
        raise self.error(f"{self.name} not {self.ready_state} after {timeout:.0f}s{self.tail_note()}")

    def tail_note(self) -> str:
        """What an error about the child adds: where its log is, or its last lines."""
        return ""

    def start(self) -> None:
        raise NotImplementedError

    def wait_ready(self) -> None:
        raise NotImplementedError

    def stop(self) -> int | None:
        raise NotImplementedError

    def __enter__(self):
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
