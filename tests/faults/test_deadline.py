"""A gateway deadline returns the engine's KV blocks within 1 s, 50 times out of 50, whichever step the request
was in when its deadline passed (queued, in preprocess, in prefill, decoding): the gateway cancels its upstream
stream and sends a ``stop`` for its id (gateway/generation.py), since Triton 2.51's ensemble never marks the
llm step in flight cancelled. Each request (900 tokens) outlasts its deadline on any CPU: the suite's engine paces
its steps (tests/faults/conftest.py). From each request's log line: at most one engine step (the one in flight)
ended between its stop reaching the engine and its taking effect."""
from __future__ import annotations

import json
import time

import grpc

from tests.e2e.helpers import gauge, kv_used, wait_until
from tests.faults import clients
from tests.faults.clients import Outcome
from tests.faults.conftest import shortest_run_s

TRIALS = 50
MAX_TOKENS = 900
DEADLINES_S = (0.05, 0.1, 0.2, 0.3, 0.5, 0.8)
FREED_WITHIN_S = 1.0


def test_gateway_deadlines_free_kv_within_a_second(faulty, record):
    url = faulty.metrics_url
    active = lambda: gauge(url, "nv_trt_llm_request_metrics", request_type="active")  # noqa: E731
    wait_until(lambda: kv_used(url) == 0 and active() == 0, 30, "an idle engine before the trials")
    assert shortest_run_s(MAX_TOKENS) > 4 * max(DEADLINES_S), "the requests must outlast their deadlines"
    freed, held = [], 0
    for i in range(TRIALS):
        deadline = DEADLINES_S[i % len(DEADLINES_S)]
        out = Outcome("grpc")
        clients.gateway_grpc(faulty.gateway.target, out, MAX_TOKENS, deadline, request_id=f"deadline-{i}")
        expired = time.monotonic()
        assert out.error == grpc.StatusCode.DEADLINE_EXCEEDED.name, (i, out.error)
        held = max(held, kv_used(url))
        freed.append(wait_until(lambda: kv_used(url) == 0 and active() == 0, FREED_WITHIN_S,
                                f"trial {i} (deadline {deadline} s): KV blocks and the request freed", interval=0.02))
        time.sleep(0.2)       # and nothing comes back after: a request that reached the engine late
        assert kv_used(url) == 0 and active() == 0, f"trial {i}: KV used again {time.monotonic() - expired:.2f} s " \
                                                    "after the deadline"
    lines = request_lines(faulty.server.log_path, "deadline-")
    aborted = [line for line in lines if line["steps_after_stop"] is not None]   # reached the engine before its stop
    assert all(line["finish_reason"] == "abort" and line["output_tokens"] < MAX_TOKENS for line in lines), lines[:3]
    assert all(line["steps_after_stop"] <= 1 for line in aborted), [line["steps_after_stop"] for line in aborted]
    record("gateway deadline", trials=TRIALS, kv_freed_within_1s=sum(f <= FREED_WITHIN_S for f in freed),
           freed_p50_s=round(sorted(freed)[len(freed) // 2], 2), freed_max_s=round(max(freed), 2),
           most_blocks_held_at_deadline=held, aborted_in_the_engine=len(aborted),
           steps_after_the_stop_max=max((line["steps_after_stop"] for line in aborted), default=None))


def request_lines(log_path, prefix: str) -> list[dict]:
    """The ``request_finished`` log lines of the requests whose client id starts with ``prefix``."""
    lines = []
    for text in log_path.read_text(errors="replace").splitlines():
        if text.startswith('{"event":"request_finished"') and f'"request_id":"{prefix}' in text:
            lines.append(json.loads(text))
    return lines
