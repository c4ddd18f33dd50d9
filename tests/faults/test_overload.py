"""Ten times ``max_num_seqs`` requests at once (``max_num_seqs=8``, ``max_queued_requests=16``): the excess is
refused at once (direct: a final error naming ``max_queued_requests``; the gateway: RESOURCE_EXHAUSTED with a
RetryInfo; HTTP: 429 with Retry-After), every admitted request completes, and every KV block comes back.

"At once" is the engine's state, not a clock: the llm model refuses a request on Triton's thread, as it
arrives, when ``max_num_seqs + max_queued_requests`` requests are in flight (backend/serving/llm_serving.py), and
the direct error states that count, so every refusal was made while the engine was full and none waited for a
slot. The seconds from the first send to each answer are recorded for docs/reliability.md, not asserted: on a
loaded CI machine the client's own threads set them."""
from __future__ import annotations

import threading
import time

import grpc
import httpx
from google.rpc import error_details_pb2, status_pb2

from backend.engine.inbox import queue_full_error
from cli.client import build_inputs
from tests.e2e.helpers import Stream, gauge, kv_used, wait_until
from tests.faults.conftest import MAX_NUM_SEQS, MAX_QUEUED_REQUESTS
from triton_llm.v1 import llm_service_pb2 as pb
from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc

N = 10 * MAX_NUM_SEQS
MAX_TOKENS = 128


def idle(url: str) -> None:
    wait_until(lambda: kv_used(url) == 0 and gauge(url, "nv_trt_llm_request_metrics", request_type="active") == 0,
               30, "every KV block and request back")


def check_split(kind: str, admitted: list[float], refused: list[float], record) -> None:
    """``admitted`` and ``refused``: when each request's final answer came, in seconds from the first send."""
    assert len(admitted) + len(refused) == N
    assert MAX_NUM_SEQS + MAX_QUEUED_REQUESTS <= len(admitted) < N, f"{kind}: {len(admitted)} admitted"
    record(f"overload {N} requests ({kind})", admitted=len(admitted), refused=len(refused),
           refusal_max_s=round(max(refused), 3), first_done_s=round(min(admitted), 3))


def test_direct_clients_get_an_error_naming_the_queue_cap(faulty, record):
    errors: list[tuple[float, str]] = []
    finals: list[float] = []
    with Stream(faulty.server.grpc_url) as s:
        first = time.monotonic()
        sent = [s.send(build_inputs("def f(x):", MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0.0, stream=True))
                for _ in range(N)]
        deadline = first + 300
        while len(finals) + len(errors) < N:
            rid, chunk = s.pump(max(0.01, deadline - time.monotonic()))
            if chunk is None:   # an error: this API gives it no request id, so count it, timed from the first send
                errors.append((time.monotonic() - first, s.results[rid].error))
            elif chunk.final:
                finals.append(time.monotonic() - first)
        done = [r for r in (s.results[rid] for rid in sent) if r.num_final]
    full = queue_full_error(MAX_NUM_SEQS + MAX_QUEUED_REQUESTS, MAX_NUM_SEQS, MAX_QUEUED_REQUESTS)
    assert all(full in e for _, e in errors), errors[:3]
    assert len(done) == len(finals) and all(r.num_output_tokens == MAX_TOKENS for r in done)
    check_split("direct", finals, [t for t, _ in errors], record)
    idle(faulty.metrics_url)


def test_the_gateway_answers_resource_exhausted_with_a_retry_delay(faulty, record):
    results: list[tuple[str, float, float | None]] = []
    first = time.monotonic()

    def call(stub) -> None:
        req = pb.GenerateRequest(prompt="def f(x):", max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0.0,
                                 stream=True)
        try:
            n = sum(1 for _ in stub.Generate(req, timeout=300))
            results.append(("OK" if n else "EMPTY", time.monotonic() - first, None))
        except grpc.RpcError as e:
            retry = None
            for key, value in e.trailing_metadata() or ():
                if key == "grpc-status-details-bin":
                    info = error_details_pb2.RetryInfo()
                    for detail in status_pb2.Status.FromString(value).details:
                        if detail.Unpack(info):
                            retry = info.retry_delay.ToMilliseconds() / 1000
            results.append((e.code().name, time.monotonic() - first, retry))

    with grpc.insecure_channel(faulty.gateway.target) as ch:
        stub = pb_grpc.LLMServiceStub(ch)
        threads = [threading.Thread(target=call, args=(stub,)) for _ in range(N)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    refused = [r for r in results if r[0] != "OK"]
    assert all(code == "RESOURCE_EXHAUSTED" and retry == 1.0 for code, _, retry in refused), refused[:3]
    check_split("gateway gRPC", [at for code, at, _ in results if code == "OK"], [at for _, at, _ in refused], record)
    idle(faulty.metrics_url)


def test_http_answers_429_with_retry_after(faulty, record):
    results: list[tuple[int, float, str | None]] = []
    body = {"model": faulty.model, "prompt": "def f(x):", "max_tokens": MAX_TOKENS, "min_tokens": MAX_TOKENS,
            "temperature": 0.0}
    first = time.monotonic()

    def call(client: httpx.Client) -> None:
        r = client.post(faulty.gateway.openai_url + "/v1/completions", json=body)
        results.append((r.status_code, time.monotonic() - first, r.headers.get("retry-after")))

    with httpx.Client(timeout=300, limits=httpx.Limits(max_connections=N)) as client:
        threads = [threading.Thread(target=call, args=(client,)) for _ in range(N)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    refused = [r for r in results if r[0] != 200]
    assert all(status == 429 and retry == "1" for status, _, retry in refused), refused[:3]
    check_split("HTTP", [at for status, at, _ in results if status == 200], [at for _, at, _ in refused], record)
    idle(faulty.metrics_url)
