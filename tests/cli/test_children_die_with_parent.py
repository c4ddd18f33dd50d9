"""A launcher killed with SIGKILL takes its children with it: the gateway (the real ``python -m gateway``,
started by ``GatewayProcess``) and tritonserver (a stand-in binary started by ``TritonServer``), each from
a throwaway parent process through the launcher's own ``start()``."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cli.launcher import REPO, free_port

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

GATEWAY_PARENT = """
from cli.gateway_process import GatewayProcess
g = GatewayProcess("127.0.0.1:{port}", "localhost:1").start()
print(g.proc.pid, flush=True)
import time; time.sleep(600)
"""
TRITON_PARENT = """
from pathlib import Path
from cli.launcher import Ports, TritonInstall, TritonServer
s = TritonServer(Path("{repo}"), Ports(1, 2, 3), install=TritonInstall(Path("{binary}"), None))
s.start()
print(s.proc.pid, flush=True)
import time; time.sleep(600)
"""


def alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting for its new parent to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def kill_parent_and_watch_child(script: str, grace_s: float) -> None:
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        time.sleep(1.0)                         # the child is up (and, for the gateway, importing)
        assert alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + grace_s
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(child), f"child {child} outlived its SIGKILLed parent by {grace_s} s"
    finally:
        parent.kill()
        if child is not None and alive(child):
            os.kill(child, signal.SIGKILL)


def test_the_gateway_dies_with_the_launcher():
    kill_parent_and_watch_child(GATEWAY_PARENT.format(port=free_port()), grace_s=10)


def test_tritonserver_dies_with_the_launcher(tmp_path):
    binary = tmp_path / "tritonserver"
    binary.write_text("#!/bin/sh\nexec sleep 600\n")
    binary.chmod(0o755)
    kill_parent_and_watch_child(TRITON_PARENT.format(repo=tmp_path, binary=binary), grace_s=5)
