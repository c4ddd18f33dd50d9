"""A gateway deadline returns the engine's KV blocks within 1 s, 50 times out of 50, whichever step the request
was in when its deadline passed (queued, in preprocess, in prefill, decoding): the gateway cancels its upstream
stream and sends a ``stop`` for its id (gateway/generation.py), since Triton 2.51's ensemble never marks the
llm step in flight cancelled."""
from __future__ import annotations

import time

import grpc

from tests.e2e.helpers import gauge, kv_used, wait_until
from tests.faults import clients
from tests.faults.clients import Outcome

TRIALS = 50
DEADLINES_S = (0.05, 0.1, 0.2, 0.3, 0.5, 0.8)
FREED_WITHIN_S = 1.0


def test_gateway_deadlines_free_kv_within_a_second(faulty, record):
    url = faulty.metrics_url
    active = lambda: gauge(url, "nv_trt_llm_request_metrics", request_type="active")  # noqa: E731
    wait_until(lambda: kv_used(url) == 0 and active() == 0, 30, "an idle engine before the trials")
    freed, held = [], 0
    for i in range(TRIALS):
        deadline = DEADLINES_S[i % len(DEADLINES_S)]
        out = Outcome("grpc")
        clients.gateway_grpc(faulty.gateway.target, out, 900, deadline, request_id=f"deadline-{i}")
        expired = time.monotonic()
        assert out.error == grpc.StatusCode.DEADLINE_EXCEEDED.name, (i, out.error)
        held = max(held, kv_used(url))
        freed.append(wait_until(lambda: kv_used(url) == 0 and active() == 0, FREED_WITHIN_S,
                                f"trial {i} (deadline {deadline} s): KV blocks and the request freed", interval=0.02))
        time.sleep(0.2)       # and nothing comes back after: a request that reached the engine late
        assert kv_used(url) == 0 and active() == 0, f"trial {i}: KV used again {time.monotonic() - expired:.2f} s " \
                                                    "after the deadline"
    record("gateway deadline", trials=TRIALS, kv_freed_within_1s=sum(f <= FREED_WITHIN_S for f in freed),
           freed_p50_s=round(sorted(freed)[len(freed) // 2], 2), freed_max_s=round(max(freed), 2),
           most_blocks_held_at_deadline=held)
