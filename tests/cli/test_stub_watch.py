"""cli/stub_watch.py, cli/supervisor.py, cli/liveness.py against a fake /proc and fake servers."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli import liveness
from cli.stub_watch import StubWatch, alive, stub_processes
from cli.supervisor import Supervisor


def fake_proc(root: Path, pid: int, ppid: int, argv: list[str], state: str = "S") -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(f"{pid} (name with) parens) {state} {ppid} 1 1 0\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def stub_argv(model: str) -> list[str]:
    return ["/x/backends/python/triton_python_backend_stub", f"/repo/model_repository/{model}/1/model.py",
            "shm", "1", "2", "100", "/lib", "ipc", f"{model}_0_0", "/repo"]


def test_stubs_are_the_servers_stub_children_by_model(tmp_path):
    fake_proc(tmp_path, 100, 1, ["tritonserver"])
    fake_proc(tmp_path, 101, 100, stub_argv("llm"))
    fake_proc(tmp_path, 102, 100, stub_argv("preprocess"))
    fake_proc(tmp_path, 103, 100, ["/bin/sh", "-c", "x"])               # a child, not a stub
    fake_proc(tmp_path, 104, 999, stub_argv("postprocess"))             # another server's stub
    fake_proc(tmp_path, 105, 100, stub_argv("postprocess"), state="Z")  # dead, not reaped
    stubs = stub_processes(100, tmp_path)
    assert {pid: s.model for pid, s in stubs.items()} == {101: "llm", 102: "preprocess"}


def test_a_watch_names_a_stub_that_is_gone_or_a_zombie(tmp_path):
    fake_proc(tmp_path, 101, 100, stub_argv("llm"))
    fake_proc(tmp_path, 102, 100, stub_argv("preprocess"))
    fake_proc(tmp_path, 103, 100, stub_argv("postprocess"))
    watch = StubWatch(100, tmp_path)
    assert len(watch.arm()) == 3 and watch.check() == []
    fake_proc(tmp_path, 101, 100, stub_argv("llm"), state="Z")
    for f in (tmp_path / "103").iterdir():
        f.unlink()
    (tmp_path / "103").rmdir()
    fake_proc(tmp_path, 110, 100, stub_argv("postprocess"))   # Triton replaced it: the old one's requests are lost
    assert [d.stub.model for d in watch.check()] == ["llm", "postprocess"]
    assert "'llm' model's Python stub (pid 101) died" in str(watch.check()[0])


def test_alive_is_false_for_a_missing_pid(tmp_path):
    assert not alive(12345, tmp_path)


class FakeServer:
    """A TritonServer stand-in: a sleeping child process per start."""

    def __init__(self):
        self.proc = None
        self.starts, self.stops = 0, []

    def start(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        self.starts += 1

    def wait_ready(self, timeout):
        pass

    def stop(self, timeout=30.0, signum=signal.SIGINT):
        proc, self.proc = self.proc, None
        self.stops.append(signum)
        if proc is not None:
            proc.send_signal(signum)
            proc.wait(timeout=10)


def test_a_dead_stub_restarts_the_server_and_the_liveness_file_says_so(tmp_path):
    server, proc = FakeServer(), tmp_path / "proc"
    server.start()
    first = server.proc
    fake_proc(proc, 101, first.pid, stub_argv("llm"))
    sup = Supervisor(server, poll_s=0.05, grace_s=0.5, liveness_path=tmp_path / "live.json", log=lambda m: None,
                     proc=proc)
    sup.arm()
    assert sup.check() == [] and liveness.check(tmp_path / "live.json", proc=proc) is None
    fake_proc(proc, 101, first.pid, stub_argv("llm"), state="Z")
    assert "dead" in liveness.check(tmp_path / "live.json", proc=proc)   # the probe sees it before the watch acts
    restart = sup.restart(sup.check())
    assert server.stops == [signal.SIGTERM] and server.starts == 2 and first.poll() is not None
    assert restart.ready_s >= restart.stopped_s >= 0 and "'llm'" in restart.reason and len(sup.restarts) == 1
    assert liveness.check(tmp_path / "live.json", proc=proc) is None
    assert json.loads((tmp_path / "live.json").read_text())["restarts"] == 1
    server.proc.kill()
    assert sup.run() == -signal.SIGKILL       # the server's own exit ends the launcher
    server.proc = None


def test_liveness_fails_when_stale_failed_or_a_listed_stub_is_dead(tmp_path):
    path = tmp_path / "live.json"
    assert "cannot read" in liveness.check(path)
    fake_proc(tmp_path / "proc", 101, 100, stub_argv("llm"))
    state = {"at": time.time(), "state": "serving", "server_pid": 100, "stubs": [101]}
    path.write_text(json.dumps(state))
    assert liveness.check(path, proc=tmp_path / "proc") is None
    assert "last reported" in liveness.check(path, 10, now=time.time() + 60, proc=tmp_path / "proc")
    path.write_text(json.dumps({**state, "stubs": [101, 102]}))
    assert "[102]" in liveness.check(path, proc=tmp_path / "proc")
    path.write_text(json.dumps({**state, "state": "restarting", "stubs": []}))
    assert liveness.check(path, proc=tmp_path / "proc") is None
    path.write_text(json.dumps({**state, "state": "failed", "reason": "not ready"}))
    assert "could not be restarted" in liveness.check(path, proc=tmp_path / "proc")


def test_poll_interval_is_at_most_a_second():
    with pytest.raises(ValueError, match="poll_s"):
        Supervisor(FakeServer(), poll_s=2.0)
