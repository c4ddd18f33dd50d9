"""A Python stub SIGKILLed with 16 streams in flight (direct to Triton, through the gateway's gRPC and HTTP APIs):
the launcher's watch restarts tritonserver, every stream ends with an error within 10 s (none hangs), readiness
turns false, and once it is back a request succeeds. For the ``llm``, ``preprocess`` and ``postprocess`` stubs."""
from __future__ import annotations

import os
import signal
import time

import pytest

from cli import liveness
from cli.stub_watch import stub_processes
from tests.e2e.helpers import gauge, run, wait_until
from tests.faults import clients
from tests.faults.clients import Outcome
from tests.faults.conftest import none_ended

MIX = {"direct": 6, "grpc": 5, "http": 5}     # 16 streams: 8 running (max_num_seqs), 8 waiting
MAX_TOKENS = 900
ERROR_WITHIN_S = 10.0


def start_streams(faulty) -> tuple[list[Outcome], list]:
    outs, threads = [], []
    for kind, n in MIX.items():
        for _ in range(n):
            out = Outcome(kind)
            if kind == "direct":
                t = clients.start(clients.direct, faulty.server.grpc_url, out, MAX_TOKENS, 120)
            elif kind == "grpc":
                t = clients.start(clients.gateway_grpc, faulty.gateway.target, out, MAX_TOKENS, 120)
            else:
                t = clients.start(clients.gateway_http, faulty.gateway.openai_url, faulty.model, out, MAX_TOKENS, 120)
            outs.append(out)
            threads.append(t)
    return outs, threads


@pytest.mark.parametrize("model", ["llm", "preprocess", "postprocess"])
def test_a_dead_stub_ends_every_stream_and_the_server_comes_back(faulty, model, record):
    server, sup = faulty.server, faulty.supervisor
    restarts = len(sup.restarts)
    outs, threads = start_streams(faulty)
    active = lambda: gauge(faulty.metrics_url, "nv_trt_llm_request_metrics", request_type="active")  # noqa: E731

    def all_in_flight() -> bool:
        none_ended(outs, "16 were in flight", MAX_TOKENS)
        return active() == len(outs) and sum(o.started.is_set() for o in outs) >= 8
    wait_until(all_in_flight, 120, "16 streams in the engine, 8 of them generating")
    (stub,) = [s for s in stub_processes(server.proc.pid).values() if s.model == model]
    killed = time.monotonic()
    os.kill(stub.pid, signal.SIGKILL)

    not_ready = wait_until(lambda: not server.is_ready(), ERROR_WITHIN_S, "readiness false", interval=0.02)
    for t in threads:
        t.join(timeout=max(0.1, killed + ERROR_WITHIN_S + 5 - time.monotonic()))
    hung = [o.kind for o in outs if o.ended_at is None]
    assert not hung, f"streams still open {ERROR_WITHIN_S + 5:.0f} s after the {model} stub died: {hung}"
    took = [o.ended_at - killed for o in outs]
    assert max(took) <= ERROR_WITHIN_S, f"slowest stream ended {max(took):.1f} s after the kill"
    lost = [o for o in outs if not o.ok]
    if model == "llm":        # the engine's stub: nothing in flight can finish
        assert len(lost) == len(outs)
    for o in lost:
        if o.kind == "grpc":
            assert o.error == "UNAVAILABLE", o.error
        elif o.kind == "http":
            assert o.error.startswith(("SSE error", "HTTP 503")), o.error
        else:
            assert o.error and o.error != "hang", o.error

    faulty.restarted(restarts + 1)
    restart = sup.restarts[-1]
    assert f"'{model}' model's Python stub (pid {stub.pid}) died" in restart.reason
    wait_until(lambda: faulty.gateway.health() == "SERVING", 30, "the gateway SERVING again")
    ready = time.monotonic() - killed
    ok = run(server.grpc_url, "x = 1", 4, temperature=0.0)
    assert ok.error is None and ok.num_final == 1
    after = Outcome("grpc")
    clients.gateway_grpc(faulty.gateway.target, after, 4, 60)
    assert after.ok, after.error
    assert liveness.check(sup.liveness_path) is None
    record(f"{model} stub SIGKILL, 16 streams", streams=len(outs), lost=len(lost),
           first_error_s=round(min(took), 2), last_error_s=round(max(took), 2),
           not_ready_s=round(not_ready, 2), stopped_s=round(restart.stopped_s, 2),
           ready_again_s=round(ready, 1), errors=sorted({f"{o.kind}: {o.error[:40]}" for o in lost}))
