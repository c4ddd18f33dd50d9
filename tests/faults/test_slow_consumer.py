"""Slow consumers: 16 clients that stop reading their streams after the first response. The gateway keeps reading
Triton (gateway/stream_buffer.py: each stream's output waits coalesced, within ``--stream-buffer-bytes``), so the
engine finishes those requests and frees their KV blocks while the clients still have not read, other streams
complete meanwhile, and the unread clients later get every token.

The demo model's context is 1,024 tokens (600 are asked here), so a stream carries a few KB of text: less than
gRPC's own windows hold, and the gateway's cap (1 MiB by default) is never reached here. Reaching it
(RESOURCE_EXHAUSTED, the request stopped) is tested against a fake Triton that streams faster than any client
reads: tests/gateway/test_gateway_backpressure.py."""
from __future__ import annotations

import time

import grpc

from tests.e2e.helpers import gauge, kv_used, wait_until
from tests.faults import clients
from tests.faults.clients import PROMPT, Outcome
from triton_llm.v1 import llm_service_pb2 as pb
from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc

UNREAD = 16
READERS = 4
MAX_TOKENS = 600
# A client whose HTTP/2 window stays small, so that what it does not read waits in the gateway, not in transit.
SMALL_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]


def test_unread_streams_are_drained_and_other_streams_complete(faulty, record):
    url = faulty.metrics_url
    active = lambda: gauge(url, "nv_trt_llm_request_metrics", request_type="active")  # noqa: E731
    target = faulty.gateway.target
    channels = [grpc.insecure_channel(target, options=SMALL_WINDOW) for _ in range(UNREAD)]
    try:
        t0 = time.monotonic()
        unread = [pb_grpc.LLMServiceStub(ch).Generate(pb.GenerateRequest(
            prompt=PROMPT, max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0.0, stream=True,
            request_id=f"unread-{i}"), timeout=300) for i, ch in enumerate(channels)]
        firsts = [next(call) for call in unread]            # each stream started; then nobody reads them
        readers = [Outcome("grpc") for _ in range(READERS)]
        threads = [clients.start(clients.gateway_grpc, target, o, MAX_TOKENS, 300) for o in readers]
        for t in threads:
            t.join(timeout=300)
        assert all(o.ok and o.tokens == MAX_TOKENS for o in readers), [(o.error, o.tokens) for o in readers]
        wait_until(lambda: kv_used(url) == 0 and active() == 0, 120,
                   "every request out of the engine while 16 clients have not read")
        drained = time.monotonic() - t0
        tokens = []
        for first, call in zip(firsts, unread):
            last = first
            for last in call:
                pass
            tokens.append(last.num_output_tokens)
    finally:
        for ch in channels:
            ch.close()
    assert tokens == [MAX_TOKENS] * UNREAD, tokens
    record("slow consumers (16 unread streams of 600 tokens)", unread=UNREAD, readers_completed=READERS,
           engine_drained_s=round(drained, 1), unread_tokens_delivered_later=sum(tokens), lost=0)
