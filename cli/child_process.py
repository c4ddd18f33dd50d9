"""Child processes of the launcher: stopped gracefully then killed, dying with their parent, used as
context managers (start, wait until ready, stop on the way out)."""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys


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
    last, also when the child never becomes ready."""

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
