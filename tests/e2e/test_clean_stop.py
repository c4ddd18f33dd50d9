"""A clean stop is clean: a tritonserver of this module's own, with tracing on (the llm and postprocess
models then hold the most metric and tracing objects), serves a request, is stopped with SIGINT (Triton's
graceful shutdown, what Ctrl-C sends) and its log must hold no crash. A Triton metric family left alive until
interpreter teardown logs ``Segfault encountered`` in ``Metric::Clear()`` (the models' ``finalize()``
releases them: backend/serving/metrics.py)."""
from __future__ import annotations

import pytest

from cli.client import stream
from cli.trace_viewer import OTLPReceiver
from tests.e2e.conftest import E2EServer, start_e2e_server

CRASH_MARKS = ("Segfault", "Signal (11)", "Signal (6)", "core dumped")


@pytest.fixture(scope="module")
def server(model_path, tmp_path_factory):
    """This module's server (the test stops it itself); the e2e log-on-failure hook reads its log."""
    receiver = OTLPReceiver(port=0).start()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_SERVICE_NAME": "triton-llm-e2e-stop",
           "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.0",
           "OTEL_BSP_SCHEDULE_DELAY": "200"}
    srv = start_e2e_server(tmp_path_factory.mktemp("clean-stop"), model_path, env=env)
    try:
        yield E2EServer(srv, model_path)
    finally:
        srv.stop(timeout=10)
        receiver.stop()


def test_a_stopped_server_logs_no_crash(server):
    chunks = list(stream(server.grpc_url, "def fibonacci(n):", 16, timeout=120, temperature=0.0))
    assert chunks and chunks[-1].final, chunks
    code = server.server.stop(timeout=60)
    log = server.server.log_path.read_text(errors="replace")
    crashes = [line for line in log.splitlines() if any(mark in line for mark in CRASH_MARKS)]
    assert not crashes, "\n".join(crashes[:20]) + f"\n--- log tail ---\n{server.log_tail(60)}"
    assert "successfully unloaded" in log or code == 0, (code, server.log_tail(60))
