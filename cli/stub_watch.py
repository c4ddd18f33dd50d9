"""The Python backend stub processes of a tritonserver, and the check that one of them died.

Each Python model instance runs in a ``triton_python_backend_stub`` child of tritonserver, started with
the model's ``.../<model>/<version>/model.py`` as its first argument. Triton 2.51 does not restart a dead
stub of a decoupled model, keeps ``/v2/health/ready`` at 200 and never ends the requests that stub had in
flight (backend/serving/health.py), and the engine's own watchdog dies with the stub. So the launcher
(``cli/supervisor.py``) looks at the stubs from outside, and the same look backs the Kubernetes liveness
probe (``cli/liveness.py``).

A stub counts as dead when its pid is gone or a zombie (killed, not yet reaped by tritonserver). A stub
that Triton replaced on its own (it does for a non-decoupled model on its next request) counts as a death
too: the requests it held were lost with it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

STUB_BINARY = "triton_python_backend_stub"
PROC = Path("/proc")


@dataclass(frozen=True)
class Stub:
    pid: int
    model: str          # the model's folder name in the repository (llm, preprocess, postprocess)


def _stat_fields(pid_dir: Path) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first, then ppid), or None."""
    try:
        raw = (pid_dir / "stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()


def alive(pid: int, proc: Path = PROC) -> bool:
    """The process exists and is not a zombie."""
    fields = _stat_fields(proc / str(pid))
    return fields is not None and fields[0] not in ("Z", "X")


def stub_processes(server_pid: int, proc: Path = PROC) -> dict[int, Stub]:
    """pid -> ``Stub`` of every live Python backend stub whose parent is ``server_pid``."""
    out: dict[int, Stub] = {}
    try:
        entries = [e for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return out
    for entry in entries:
        pid_dir = Path(entry.path)
        fields = _stat_fields(pid_dir)
        if fields is None or len(fields) < 2 or fields[0] in ("Z", "X") or int(fields[1]) != server_pid:
            continue
        try:
            argv = (pid_dir / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or os.path.basename(argv[0].decode(errors="replace")) != STUB_BINARY:
            continue
        model_py = Path(argv[1].decode(errors="replace")) if len(argv) > 1 else Path("?/?/?")
        out[int(entry.name)] = Stub(int(entry.name), model_py.parent.parent.name)
    return out


@dataclass(frozen=True)
class StubDeath:
    stub: Stub

    def __str__(self) -> str:
        return f"the {self.stub.model!r} model's Python stub (pid {self.stub.pid}) died"


class StubWatch:
    """The stubs of one tritonserver process, recorded by ``arm()`` once it is ready; ``check()`` names
    those that died since."""

    def __init__(self, server_pid: int, proc: Path = PROC):
        self.server_pid = server_pid
        self.proc = proc
        self.stubs: dict[int, Stub] = {}

    def arm(self) -> dict[int, Stub]:
        self.stubs = stub_processes(self.server_pid, self.proc)
        return self.stubs

    def check(self) -> list[StubDeath]:
        return [StubDeath(s) for pid, s in sorted(self.stubs.items()) if not alive(pid, self.proc)]
