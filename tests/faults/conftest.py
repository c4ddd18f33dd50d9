"""The fault suite's server: a real tritonserver (the e2e fixtures' model repository, with ``max_num_seqs=8`` and
a queue cap) under the launcher's ``Supervisor`` (cli/supervisor.py) in a thread, and the gateway (gRPC and the
OpenAI HTTP API) in front of it. One for the whole suite: every restart costs a model load.

Every test needs its requests still running when the fault comes, on any CPU: the engine sleeps ``STEP_DELAY_S``
after each step (``test_step_delay_s``, a setting for tests only), so a request of N tokens runs for at least
``shortest_run_s(N)`` seconds (one token and the n-gram speculation's drafts a step at most), whatever the CPU.

Each test records its figures (time to error, time to recover, requests lost) with ``record``; the run's table
is printed at the end (``python -m pytest tests/faults -q -rA``) and, with ``FAULTS_FIGURES=path``, written there
as JSON: docs/reliability.md quotes it.
"""
from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cli.gateway_process import GatewayProcess
from cli.launcher import LauncherError, Ports, TritonServer, free_port, render_model_repository
from cli.supervisor import Supervisor
from tests.e2e.conftest import GUIDED_COMPILE_TIMEOUT_S, SPECULATIVE, e2e_model_path
from tests.e2e.helpers import clean_env

MAX_NUM_SEQS = 8
MAX_QUEUED_REQUESTS = 16
KV_CACHE_BYTES = "24MiB"       # 12,288 tokens: 8 running sequences of 1,000 tokens fit
STEP_DELAY_S = 0.05            # a 900-token request runs 5 s at least; a 128-token one 0.7 s
TOKENS_PER_STEP = 1 + int(SPECULATIVE["num_speculative_tokens"])   # the most a step gives one sequence
FIGURES = pytest.StashKey[list]()


def shortest_run_s(tokens: int) -> float:
    """The least time a request of ``tokens`` can run on the suite's server, on any CPU."""
    return (math.ceil(tokens / TOKENS_PER_STEP) - 1) * STEP_DELAY_S


def none_ended(outs, what: str, tokens: int) -> None:
    """Fail at once, saying why, if a stream ended before the fault: the test would wait for nothing."""
    ended = [o.kind for o in outs if o.ended_at is not None]
    assert not ended, (f"{len(ended)} streams ended before {what} ({ended}): a {tokens}-token request should run "
                       f"{shortest_run_s(tokens):.1f} s at least with a step delay of {STEP_DELAY_S} s")


@dataclass
class Faulty:
    """The supervised server, its gateway, and the supervisor's thread."""

    server: TritonServer
    gateway: GatewayProcess
    supervisor: Supervisor
    model: str                                  # the served name on the HTTP API
    log: list[str] = field(default_factory=list)
    thread: threading.Thread | None = None

    @property
    def metrics_url(self) -> str:
        return self.server.metrics_url

    def watch(self) -> None:
        """Run the supervisor (it arms on the ready server); restarts happen on its thread."""
        self.supervisor.watch = None
        self.thread = threading.Thread(target=self.supervisor.run, name="supervisor", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while self.supervisor.watch is None and time.monotonic() < deadline:
            time.sleep(0.02)

    def restarted(self, n: int, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.supervisor.restarts) < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"no restart {n} within {timeout}s:\n" + "\n".join(self.log[-10:]) +
                                     f"\n--- server log ---\n{self.server.log_tail(40)}")
            time.sleep(0.05)


def render(root: Path, model_path: Path) -> Path:
    return render_model_repository(root / "model_repository", {
        "llm": {"model_path": str(model_path), "kv_cache_bytes": KV_CACHE_BYTES, "max_num_seqs": str(MAX_NUM_SEQS),
                "max_queued_requests": str(MAX_QUEUED_REQUESTS), "metrics_interval_s": "0.1",
                "cancel_poll_interval_s": "0.02", "device": "cpu", "test_step_delay_s": str(STEP_DELAY_S),
                "guided_compile_timeout_s": GUIDED_COMPILE_TIMEOUT_S, **SPECULATIVE},
        "preprocess": {"tokenizer_path": str(model_path)},
        "postprocess": {"tokenizer_path": str(model_path)},
    })


@pytest.fixture(scope="session")
def faulty(tmp_path_factory) -> Faulty:
    import httpx

    root = tmp_path_factory.mktemp("faults")
    server = TritonServer(render(root, e2e_model_path()), Ports.free(), log_path=root / "server.log",
                          extra_args=["--exit-timeout-secs=10"])
    gateway = GatewayProcess(f"127.0.0.1:{free_port()}", server.grpc_url, env=clean_env(),
                             openai_listen=f"127.0.0.1:{free_port()}", triton_metrics_url=server.metrics_url,
                             extra_args=["--health-interval-s", "0.2"], log_path=root / "gateway.log")
    log: list[str] = []
    supervisor = Supervisor(server, liveness_path=root / "liveness.json", log=log.append)
    try:
        server.start()
        server.wait_ready(timeout=300)
        gateway.start()
        gateway.wait_ready(timeout=60)
        model = httpx.get(gateway.openai_url + "/v1/models", timeout=10).json()["data"][0]["id"]
    except (LauncherError, Exception) as e:
        gateway.stop()
        server.stop()
        pytest.fail(f"the fault suite's servers did not start: {e}", pytrace=False)
    f = Faulty(server, gateway, supervisor, model, log)
    f.watch()
    yield f
    supervisor.request_stop()
    gateway.stop()
    server.stop(timeout=30)
    if f.thread is not None:
        f.thread.join(timeout=10)


@pytest.fixture
def record(request):
    """``record(fault, **figures)``: one row of the run's table."""
    def add(fault: str, **figures) -> None:
        request.config.stash.setdefault(FIGURES, []).append({"fault": fault, **figures})
    return add


def pytest_terminal_summary(terminalreporter, config):
    rows = config.stash.get(FIGURES, [])
    if not rows:
        return
    terminalreporter.section("fault figures (docs/reliability.md)")
    for row in rows:
        terminalreporter.write_line(json.dumps(row))
    path = os.environ.get("FAULTS_FIGURES")
    if path:
        Path(path).write_text(json.dumps(rows, indent=1) + "\n")


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/faults/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.xdist_group("faults"))   # one worker: the session's server
