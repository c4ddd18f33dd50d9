"""What a tritonserver, its Python backend stubs and the gateway hold, read from outside: RSS, open file
descriptors and threads per process from ``/proc`` (``find_server_pid``, ``server_processes``, ``rss_sample``,
``count_sample``), their growth over the second half of a run (``second_half_growth``), and gauges from the
metrics port (``gauge``, ``wait_idle``). The soak test samples them; nothing here sends a request."""
from __future__ import annotations

import os
import re
import time
import urllib.request
from pathlib import Path


def _rss_mib(pid: int, field_name: str = "VmRSS") -> float | None:
    """``VmRSS`` (or ``RssAnon``: heap; ``RssShmem``: shared memory such as the Python backend's regions)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _threads(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def find_server_pid(grpc_port: int) -> int | None:
    """The tritonserver process listening on ``grpc_port`` (by its command line), on this machine."""
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            cmd = _cmdline(int(p.name))
            if cmd and cmd[0].endswith("tritonserver") and f"--grpc-port={grpc_port}" in cmd:
                return int(p.name)
    return None


def server_processes(server_pid: int) -> dict[str, int]:
    """``{"tritonserver": pid, "stub:llm": pid, ...}``: the server and its Python backend stubs."""
    procs = {"tritonserver": server_pid}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{p.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        cmd = _cmdline(int(p.name))
        if ppid == server_pid and cmd and cmd[0].endswith("triton_python_backend_stub"):
            m = re.search(r"/([^/]+)/\d+/model\.py$", cmd[1] if len(cmd) > 1 else "")
            procs[f"stub:{m.group(1) if m else p.name}"] = int(p.name)
    return procs


def rss_sample(procs: dict[str, int], label: str, requests_done: int) -> dict:
    """RSS of each process, and tritonserver's split into heap (anon) and shared memory (shmem)."""
    sample = {"at": label, "requests": requests_done, **{name: _rss_mib(pid) for name, pid in procs.items()}}
    if "tritonserver" in procs:
        sample["tritonserver anon"] = _rss_mib(procs["tritonserver"], "RssAnon")
        sample["tritonserver shmem"] = _rss_mib(procs["tritonserver"], "RssShmem")
    return sample


def count_sample(procs: dict[str, int], label: str, requests_done: int, what: str) -> dict:
    """Open file descriptors (``what="fds"``) or threads (``"threads"``) of each process."""
    count = {"fds": _fds, "threads": _threads}[what]
    return {"at": label, "requests": requests_done, **{name: count(pid) for name, pid in procs.items()}}


def second_half_growth(samples: list[dict], percent: bool) -> dict[str, float | None]:
    """Per process: the change from the first sample at or past half the requests to the last sample, in
    percent of the first (``percent``: RSS) or absolute (fds, threads); None where a value is missing."""
    if len(samples) < 2:
        return {}
    total = samples[-1]["requests"]
    mid = next(s for s in samples if s["requests"] >= total / 2)
    out: dict[str, float | None] = {}
    for name in (k for k in samples[-1] if k not in ("at", "requests")):
        a, b = mid.get(name), samples[-1].get(name)
        if a is None or b is None or (percent and a == 0):
            out[name] = None
        else:
            out[name] = round(100.0 * (b - a) / a, 2) if percent else b - a
    return out


_METRIC = re.compile(r'^(\w+)\{([^}]*)\}\s+(\S+)$')


def gauge(metrics_url: str, family: str, label: str, value: str) -> float | None:
    try:
        text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        m = _METRIC.match(line)
        if m and m.group(1) == family and f'{label}="{value}"' in m.group(2):
            return float(m.group(3))
    return None


def wait_idle(metrics_url: str | None, timeout: float = 60.0) -> dict[str, float | None]:
    """KV blocks in use and active requests once both reach 0 (or whatever they are after ``timeout``)."""
    if metrics_url is None:
        return {"kv_blocks_used": None, "active_requests": None, "idle_after_s": None}
    t0 = time.monotonic()
    while True:
        used = gauge(metrics_url, "nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type", "used")
        active = gauge(metrics_url, "nv_trt_llm_request_metrics", "request_type", "active")
        if (used == 0 and active == 0) or time.monotonic() - t0 > timeout:
            return {"kv_blocks_used": used, "active_requests": active, "idle_after_s": round(time.monotonic() - t0, 2)}
        time.sleep(0.25)
