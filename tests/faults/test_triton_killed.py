"""tritonserver SIGKILLed under load behind the gateway: every in-flight gRPC and HTTP call ends with UNAVAILABLE
(HTTP 503, or an SSE error event once a stream has started) in under 5 s, health turns NOT_SERVING, new calls
fail at once rather than queue; started again on the same ports, it is served without restarting the gateway."""
from __future__ import annotations

import signal
import time

import httpx

from tests.e2e.helpers import gauge, wait_until
from tests.faults import clients
from tests.faults.clients import Outcome
from tests.faults.conftest import none_ended

MAX_TOKENS = 900
ERROR_WITHIN_S = 5.0


def test_a_killed_tritonserver_fails_calls_fast_and_is_served_again(faulty, record):
    server, gw = faulty.server, faulty.gateway
    calls = [("grpc", clients.gateway_grpc, (gw.target,)),
             ("http", clients.gateway_http, (gw.openai_url, faulty.model)),
             ("http-whole", clients.gateway_http_whole, (gw.openai_url, faulty.model))]
    outs, threads = [], []
    for kind, fn, args in calls * 4:
        out = Outcome(kind)
        threads.append(clients.start(fn, *args, out, MAX_TOKENS, 120))
        outs.append(out)
    active = lambda: gauge(faulty.metrics_url, "nv_trt_llm_request_metrics", request_type="active")  # noqa: E731

    def in_flight(streaming: int) -> bool:
        none_ended(outs, "the kill", MAX_TOKENS)
        return active() == len(outs) and sum(o.started.is_set() for o in outs) >= streaming
    wait_until(lambda: in_flight(0), 120, "every call in the engine")
    wait_until(lambda: in_flight(8), 60, "8 calls streaming")

    faulty.supervisor.request_stop()          # the launcher would exit with tritonserver: the test restarts it
    killed = time.monotonic()
    server.proc.send_signal(signal.SIGKILL)
    for t in threads:
        t.join(timeout=max(0.1, killed + ERROR_WITHIN_S + 5 - time.monotonic()))
    assert all(o.ended_at is not None for o in outs), [o.kind for o in outs if o.ended_at is None]
    took = [o.ended_at - killed for o in outs]
    assert max(took) < ERROR_WITHIN_S, f"slowest call ended {max(took):.1f} s after the kill"
    for o in outs:
        assert not o.ok
        expected = {"grpc": ("UNAVAILABLE",), "http": ("SSE error", "HTTP 503"), "http-whole": ("HTTP 503",)}[o.kind]
        assert o.error.startswith(expected), (o.kind, o.error)
    not_serving = wait_until(lambda: gw.health() == "NOT_SERVING", 3.0, "gateway health NOT_SERVING")

    t = time.monotonic()                      # new calls fail at once
    fresh = Outcome("grpc")
    clients.gateway_grpc(gw.target, fresh, 8, 30)
    r = httpx.post(gw.openai_url + "/v1/completions", json={"model": faulty.model, "prompt": "x", "max_tokens": 4},
                   timeout=30)
    fail_fast = time.monotonic() - t
    assert fresh.error == "UNAVAILABLE" and r.status_code == 503 and r.headers.get("retry-after")
    assert fail_fast < 2.0, f"new calls took {fail_fast:.1f} s to fail"

    server.stop()                             # reap it; start it again on the same ports
    restarted = time.monotonic()
    server.start()
    server.wait_ready(timeout=300)
    wait_until(lambda: gw.health() == "SERVING", 15, "gateway health SERVING with Triton back")
    back = time.monotonic() - restarted
    faulty.supervisor.resume()
    faulty.watch()
    after = Outcome("grpc")
    clients.gateway_grpc(gw.target, after, 8, 60)
    assert after.ok, after.error
    r = httpx.post(gw.openai_url + "/v1/completions", json={"model": faulty.model, "prompt": "x", "max_tokens": 4},
                   timeout=60)
    assert r.status_code == 200, r.text
    assert gw.proc is not None and gw.proc.poll() is None, "the gateway was restarted"
    record("tritonserver SIGKILL behind the gateway", calls=len(outs), lost=len(outs),
           first_error_s=round(min(took), 2), last_error_s=round(max(took), 2),
           not_serving_s=round(not_serving + max(took), 2), new_call_fails_in_s=round(fail_fast, 2),
           served_again_after_start_s=round(back, 1))
