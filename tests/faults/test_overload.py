"""Ten times ``max_num_seqs`` requests at once (``max_num_seqs=8``, ``max_queued_requests=16``): the excess is
refused at once (direct: a final error naming ``max_queued_requests``; the gateway: RESOURCE_EXHAUSTED with a
RetryInfo; HTTP: 429 with Retry-After), every admitted request completes, and every KV block comes back."""
from __future__ import annotations

import threading
import time

import grpc
import httpx
from google.rpc import error_details_pb2, status_pb2

from cli.client import build_inputs
from tests.e2e.helpers import Stream, gauge, kv_used, wait_until
from tests.faults.conftest import MAX_NUM_SEQS, MAX_QUEUED_REQUESTS
from triton_llm.v1 import llm_service_pb2 as pb
from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc

N = 10 * MAX_NUM_SEQS
MAX_TOKENS = 128
REFUSED_WITHIN_S = 2.0


def idle(url: str) -> None:
    wait_until(lambda: kv_used(url) == 0 and gauge(url, "nv_trt_llm_request_metrics", request_type="active") == 0,
               30, "every KV block and request back")


def check_split(kind: str, ok: int, refused: list[float], record) -> None:
    assert ok + len(refused) == N
    assert MAX_NUM_SEQS + MAX_QUEUED_REQUESTS <= ok < N, f"{kind}: {ok} admitted"
    assert max(refused) < REFUSED_WITHIN_S, f"{kind}: a refusal took {max(refused):.2f} s"
    record(f"overload {N} requests ({kind})", admitted=ok, refused=len(refused),
           refusal_max_s=round(max(refused), 3))


def test_direct_clients_get_an_error_naming_the_queue_cap(faulty, record):
    errors: list[tuple[float, str]] = []
    finals = 0
    with Stream(faulty.server.grpc_url) as s:
        first = time.monotonic()
        sent = [s.send(build_inputs("def f(x):", MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0.0, stream=True))
                for _ in range(N)]
        deadline = first + 300
        while finals + len(errors) < N:
            rid, chunk = s.pump(max(0.01, deadline - time.monotonic()))
            if chunk is None:   # an error: this API gives it no request id, so count it, timed from the first send
                errors.append((time.monotonic() - first, s.results[rid].error))
            elif chunk.final:
                finals += 1
        done = [r for r in (s.results[rid] for rid in sent) if r.num_final]
    assert all("max_queued_requests" in e and "unavailable" in e for _, e in errors), errors[:3]
    assert len(done) == finals and all(r.num_output_tokens == MAX_TOKENS for r in done)
    check_split("direct, seconds from the first send", finals, [t for t, _ in errors], record)
    idle(faulty.metrics_url)


def test_the_gateway_answers_resource_exhausted_with_a_retry_delay(faulty, record):
    results: list[tuple[str, float, float | None]] = []

    def call(stub) -> None:
        t = time.monotonic()
        req = pb.GenerateRequest(prompt="def f(x):", max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0.0,
                                 stream=True)
        try:
            n = sum(1 for _ in stub.Generate(req, timeout=300))
            results.append(("OK" if n else "EMPTY", time.monotonic() - t, None))
        except grpc.RpcError as e:
            retry = None
            for key, value in e.trailing_metadata() or ():
                if key == "grpc-status-details-bin":
                    info = error_details_pb2.RetryInfo()
                    for detail in status_pb2.Status.FromString(value).details:
                        if detail.Unpack(info):
                            retry = info.retry_delay.ToMilliseconds() / 1000
            results.append((e.code().name, time.monotonic() - t, retry))

    with grpc.insecure_channel(faulty.gateway.target) as ch:
        stub = pb_grpc.LLMServiceStub(ch)
        threads = [threading.Thread(target=call, args=(stub,)) for _ in range(N)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    refused = [r for r in results if r[0] != "OK"]
    assert all(code == "RESOURCE_EXHAUSTED" and retry == 1.0 for code, _, retry in refused), refused[:3]
    check_split("gateway gRPC", len(results) - len(refused), [took for _, took, _ in refused], record)
    idle(faulty.metrics_url)


def test_http_answers_429_with_retry_after(faulty, record):
    results: list[tuple[int, float, str | None]] = []
    body = {"model": faulty.model, "prompt": "def f(x):", "max_tokens": MAX_TOKENS, "min_tokens": MAX_TOKENS,
            "temperature": 0.0}

    def call(client: httpx.Client) -> None:
        t = time.monotonic()
        r = client.post(faulty.gateway.openai_url + "/v1/completions", json=body)
        results.append((r.status_code, time.monotonic() - t, r.headers.get("retry-after")))

    with httpx.Client(timeout=300, limits=httpx.Limits(max_connections=N)) as client:
        threads = [threading.Thread(target=call, args=(client,)) for _ in range(N)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    refused = [r for r in results if r[0] != 200]
    assert all(status == 429 and retry == "1" for status, _, retry in refused), refused[:3]
    check_split("HTTP", len(results) - len(refused), [took for _, took, _ in refused], record)
    idle(faulty.metrics_url)
