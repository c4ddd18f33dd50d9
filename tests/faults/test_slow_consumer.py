"""Slow consumers: 16 clients that stop reading their streams after the first response. The gateway keeps reading
Triton (gateway/stream_buffer.py: each stream's output waits coalesced, within ``--stream-buffer-bytes``), so the
engine finishes those requests and frees their KV blocks while the clients still have not read, other streams
complete meanwhile, and the unread clients later get every token.

The demo model's context is 1,024 tokens (600 are asked here), so a plain stream carries a few KB of text: less
than gRPC's own windows hold, and the gateway's cap (1 MiB by default) is never reached. Streams that ask for 20
top-logprob alternatives a token carry about 300 bytes a token, past the windows: against a gateway with a 16 KiB
cap, each unread one ends with RESOURCE_EXHAUSTED and its request is stopped in the engine."""
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


CAP_BYTES = 16 << 10
CAPPED_TOKENS = 900
TOP_LOGPROBS = 20


def test_a_stream_past_its_cap_ends_resource_exhausted_and_its_request_is_stopped(faulty, tmp_path, record):
    """A gateway with a 16 KiB ``--stream-buffer-bytes`` in front of the same server: each unread stream's waiting
    output passes the cap before its request finishes, so the stream ends with RESOURCE_EXHAUSTED naming the
    setting and the gateway stops the request in the engine (KV back to 0 before any client reads); what a client
    gets before the error is the output up to that point."""
    from tests.e2e.helpers import start_gateway

    url = faulty.metrics_url
    active = lambda: gauge(url, "nv_trt_llm_request_metrics", request_type="active")  # noqa: E731
    gw = start_gateway(faulty.server, tmp_path, args=("--stream-buffer-bytes", str(CAP_BYTES)))
    channels = [grpc.insecure_channel(gw.target, options=SMALL_WINDOW) for _ in range(UNREAD)]
    try:
        t0 = time.monotonic()
        calls = [pb_grpc.LLMServiceStub(ch).Generate(pb.GenerateRequest(
            prompt=PROMPT, max_tokens=CAPPED_TOKENS, min_tokens=CAPPED_TOKENS, temperature=0.0, stream=True,
            return_log_probs=True, top_logprobs=TOP_LOGPROBS, request_id=f"capped-{i}"), timeout=300)
            for i, ch in enumerate(channels)]
        firsts = [next(call) for call in calls]
        wait_until(lambda: kv_used(url) == 0 and active() == 0, 120,
                   "every capped request out of the engine while its client has not read")
        stopped = time.monotonic() - t0
        errors, tokens = [], []
        for first, call in zip(firsts, calls):
            got = first.num_output_tokens
            try:
                for msg in call:
                    got = max(got, msg.num_output_tokens)
                errors.append(None)
            except grpc.RpcError as e:
                errors.append((e.code(), e.details()))
            tokens.append(got)
    finally:
        for ch in channels:
            ch.close()
        gw.stop()
    assert all(e is not None and e[0] == grpc.StatusCode.RESOURCE_EXHAUSTED and "stream_buffer_bytes" in e[1]
               for e in errors), errors
    assert all(0 < t < CAPPED_TOKENS for t in tokens), tokens
    record(f"slow consumers past a {CAP_BYTES // 1024} KiB cap (16 unread streams, 20 top logprobs)", unread=UNREAD,
           resource_exhausted=sum(e is not None for e in errors), engine_freed_s=round(stopped, 1),
           tokens_before_the_error_max=max(tokens))
