"""What a tritonserver and its Python backend stubs hold, read from outside: RSS per process from
``/proc`` (``find_server_pid``, ``server_processes``, ``rss_sample``) and gauges from its metrics port
(``gauge``, ``wait_idle``). The soak test samples them; nothing here sends a request."""
from __future__ import annotations

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
