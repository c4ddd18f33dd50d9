"""``ChildProcess.wait_until``: the one readiness loop of the gateway and tritonserver children."""
from __future__ import annotations

import subprocess
import sys

import pytest

from cli.child_process import ChildProcess


class Child(ChildProcess):
    name, ready_state, error = "toy", "SERVING", LookupError

    def tail_note(self) -> str:
        return " (log: here)"


def test_ready_returns_and_a_child_never_started_is_named():
    child = Child()
    with pytest.raises(LookupError, match="^toy not started$"):
        child.wait_until(lambda: True, timeout=1.0, interval=0.01)
    child.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        polls = iter([False, False, True])
        child.wait_until(lambda: next(polls), timeout=30.0, interval=0.01)
        with pytest.raises(LookupError, match=r"^toy not SERVING after 0s \(log: here\)$"):
            child.wait_until(lambda: False, timeout=0.05, interval=0.01)
    finally:
        child.proc.kill()
        child.proc.wait()


def test_a_child_that_exits_first_says_its_code_and_its_note():
    child = Child()
    child.proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    child.proc.wait()
    with pytest.raises(LookupError, match=r"^toy exited with code 3 before becoming SERVING \(log: here\)$"):
        child.wait_until(lambda: False, timeout=30.0, interval=0.01)
