"""Cancellation frees the request in the engine at once, on every path: a direct client that cancels its stream,
a ``stop`` request, a cancelled request of the ``llm`` model itself, a gateway deadline, a gateway client that
cancels, an OpenAI streaming client that disconnects.

Each test needs its request still running when the cancellation comes, on any CPU. So they run against a server
of their own whose engine sleeps ``STEP_DELAY_S`` after each step (``test_step_delay_s``, a setting for tests
only): a request of N tokens lasts at least ``ceil(N / 9) - 1`` delays (9: one token and the n-gram speculation's
8 drafts a step at most), whatever the CPU. The assertions count events, from the request's own log line
(backend/serving/request_log.py): it ended as aborted before its end, its stop reached the engine, at most one
engine step (the one in flight) ended between the stop reaching the engine and its taking effect, and every KV
block is back. The one time asserted is the gateway deadline's: the engine's last step for the request ends within
``STOPPED_WITHIN_S`` of the deadline (a generous bound; the measured figures are in docs/reliability.md)."""
from __future__ import annotations

import json
import math
import time

import grpc
import httpx
import numpy as np
import pytest

from cli.client import build_inputs
from tests.e2e.conftest import SPECULATIVE, e2e_model_path, start_e2e_server, stop_e2e_server
from tests.e2e.helpers import Stream, engine_idle, kv_used, raw_input, run, start_gateway, wait_until
from triton_llm.v1 import llm_service_pb2 as pb
from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc

STEP_DELAY_S = 0.02
TOKENS_PER_STEP = 1 + int(SPECULATIVE["num_speculative_tokens"])   # the most a step gives one sequence
LONG = 600  # tokens the request would generate if nothing stopped it (min_tokens keeps EOS away)
STOPPED_WITHIN_S = 1.0


def shortest_run_s(tokens: int) -> float:
    """The least time a request of ``tokens`` can run on this server, on any CPU."""
    return (math.ceil(tokens / TOKENS_PER_STEP) - 1) * STEP_DELAY_S


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """A server whose steps are paced (``test_step_delay_s``), and a gateway (gRPC and OpenAI HTTP) before it."""
    root = tmp_path_factory.mktemp("slow-steps")
    srv = start_e2e_server(root, e2e_model_path(), llm={"test_step_delay_s": str(STEP_DELAY_S)})
    gw = None
    try:
        gw = start_gateway(srv, root, openai=True)
        yield srv, gw
    finally:
        if gw is not None:
            code = gw.stop()
            assert code == 0, f"the gateway exited with {code}\n{gw.log_tail()}"
        stop_e2e_server(srv)


def long_request(**opts):
    return build_inputs("def parse(lines):\n", LONG, min_tokens=LONG, temperature=0.0, stream=True,
                        exclude_input_in_output=True, **opts)


def log_line(srv, request_id: str, timeout: float = 10.0) -> dict:
    """The request's ``request_finished`` log line (telemetry writes it off the engine loop)."""
    found: list[dict] = []

    def scan() -> bool:
        for line in srv.log_path.read_text(errors="replace").splitlines():
            if line.startswith('{"event":"request_finished"') and f'"request_id":"{request_id}"' in line:
                found.append(json.loads(line))
                return True
        return False
    wait_until(scan, timeout, f"the log line of {request_id}")
    return found[0]


def assert_stopped_in_the_engine(line: dict, tokens: int, *stopped_by: str) -> None:
    """Aborted before its end by one of ``stopped_by``; at most the step in flight ran after the stop reached the
    engine."""
    assert line["finish_reason"] == "abort" and line["stopped_by"] in stopped_by, line
    assert line["output_tokens"] < tokens, line
    assert line["steps_after_stop"] in (0, 1), line
    assert line["stop_s"] is not None and line["last_step_s"] is not None, line


def test_the_requests_cannot_finish_before_they_are_cancelled():
    """The arrangement the tests below rely on, stated: their requests outlast the cancellations by seconds."""
    assert shortest_run_s(LONG) >= 1.0 and shortest_run_s(1000) >= 4 * 0.25


def test_client_cancellation_frees_kv(slow):
    srv, _ = slow
    engine_idle(srv.metrics_url, "the previous tests")
    s = Stream(srv.grpc_url)
    rid = s.send(long_request(), request_id="cancel-direct-1")
    for _ in range(3):
        r, chunk = s.pump(timeout=60)
        assert chunk is not None, s.results[r].error
    s.close(cancel=True)  # cancels every request in flight on this gRPC stream
    engine_idle(srv.metrics_url, "client cancellation")
    assert not s.results[rid].num_final  # the client went away before the end
    assert_stopped_in_the_engine(log_line(srv, rid), LONG, "cancelled")
    ok = run(srv.grpc_url, "x = 1", 4, temperature=0.0)
    assert ok.error is None and ok.num_final == 1


def test_stop_request_ends_the_stream_with_a_final_response(slow):
    srv, _ = slow
    engine_idle(srv.metrics_url, "the previous tests")
    with Stream(srv.grpc_url) as s, Stream(srv.grpc_url) as stopper:
        rid = s.send(long_request(), request_id="stop-me-1")
        for _ in range(3):
            _, chunk = s.pump(timeout=60)
            assert chunk is not None
        stop_id = stopper.send(build_inputs("", 1, stop=True), request_id="stop-me-1")
        ack = stopper.wait([stop_id], timeout=10)[stop_id]
        assert ack.error is None and ack.num_final == 1 and ack.text == ""
        res = s.wait([rid], timeout=30)[rid]
    assert res.error is None, res.error
    assert res.num_final == 1 and res.chunks[-1].final
    assert res.finish_reason == "abort"
    assert res.num_output_tokens < LONG
    engine_idle(srv.metrics_url, "the stop request")
    assert_stopped_in_the_engine(log_line(srv, rid), LONG, "stop_request")


def test_stop_request_for_an_unknown_id_is_answered(slow):
    srv, _ = slow
    with Stream(srv.grpc_url) as s:
        rid = s.send(build_inputs("", 1, stop=True), request_id="nobody-has-this-id")
        res = s.wait([rid], timeout=10)[rid]
    assert res.error is None and res.num_final == 1


def test_direct_llm_request_cancellation(slow):
    """A client of the `llm` model itself: its cancellation reaches the engine through is_cancelled()."""
    from contracts import wire
    from contracts.sampling_params import SamplingParams

    srv, _ = slow
    engine_idle(srv.metrics_url, "the previous tests")
    req = wire.LLMRequest(SamplingParams(max_tokens=LONG, min_tokens=LONG, temperature=0.0), stream=True)
    inputs = [raw_input(wire.INPUT_IDS, np.asarray([[0, 5, 6, 7, 8]], dtype=np.int32), "INT32"),
              raw_input(wire.REQUEST, np.asarray([[req.to_json().encode()]], dtype=np.object_), "BYTES")]
    s = Stream(srv.grpc_url)
    s.client.async_stream_infer("llm", inputs, request_id="direct-1", enable_empty_final_response=True)
    for _ in range(3):
        assert s._q.get(timeout=60)[1] is None
    s.close(cancel=True)
    engine_idle(srv.metrics_url, "cancelling a direct llm request")
    assert_stopped_in_the_engine(log_line(srv, "direct-1"), LONG, "cancelled")


# ---- through the gateway -----------------------------------------------------------------------------------

GATEWAY_LONG = 1000    # context 1024
# the gateway's stop request, or Triton's cancellation of its upstream stream, whichever reaches the llm model first
GATEWAY_STOPS = ("stop_request", "cancelled")
DEADLINE_S = 0.25
# sampled, so that n-gram drafts are rarely accepted (the bound above holds either way)
LONG_REQUEST = dict(prompt="def parse(lines):\n", max_tokens=GATEWAY_LONG, min_tokens=GATEWAY_LONG, temperature=1.0,
                    seed=7, stream=True, exclude_input_in_output=True)


def test_gateway_deadline_is_deadline_exceeded_and_the_engine_stops_within_a_second(slow):
    srv, gw = slow
    engine_idle(srv.metrics_url, "the previous tests")
    got = []
    with grpc.insecure_channel(gw.target) as ch:
        sent = time.time()
        with pytest.raises(grpc.RpcError) as e:
            for msg in pb_grpc.LLMServiceStub(ch).Generate(pb.GenerateRequest(**LONG_REQUEST, request_id="dl-1"),
                                                           timeout=DEADLINE_S):
                got.append(msg)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert got, "no token before the deadline: make the deadline longer"
    engine_idle(srv.metrics_url, "the deadline")
    line = log_line(srv, "dl-1")
    assert_stopped_in_the_engine(line, GATEWAY_LONG, *GATEWAY_STOPS)
    last_step = line["arrival_unix"] + line["last_step_s"]
    after_deadline = last_step - (sent + DEADLINE_S)
    assert after_deadline < STOPPED_WITHIN_S, f"the engine's last step came {after_deadline:.3f} s after the deadline"
    print(f"\ngateway deadline: the stop reached the engine {line['arrival_unix'] + line['stop_s'] - sent - DEADLINE_S:.3f} s "
          f"after the deadline, its last step ended {after_deadline:.3f} s after it "
          f"({line['steps_after_stop']} steps after the stop)")


def test_gateway_client_cancellation_frees_kv(slow):
    srv, gw = slow
    engine_idle(srv.metrics_url, "the previous tests")
    with grpc.insecure_channel(gw.target) as ch:
        call = pb_grpc.LLMServiceStub(ch).Generate(pb.GenerateRequest(**LONG_REQUEST, request_id="gw-cancel-1"))
        for i, _ in enumerate(call):
            if i == 2:
                break
        wait_until(lambda: kv_used(srv.metrics_url) > 0, 5, "the running request holds KV blocks")
        call.cancel()
    engine_idle(srv.metrics_url, "client cancellation")
    assert_stopped_in_the_engine(log_line(srv, "gw-cancel-1"), GATEWAY_LONG, *GATEWAY_STOPS)
    with grpc.insecure_channel(gw.target) as ch:
        out = list(pb_grpc.LLMServiceStub(ch).Generate(pb.GenerateRequest(prompt="x = 1", max_tokens=4,
                                                                          temperature=0.0), timeout=60))
    assert out[-1].usage.completion_tokens >= 1


def test_openai_disconnect_mid_stream_frees_kv(slow):
    """A streaming client of the OpenAI API that closes its connection: the gateway stops the request."""
    srv, gw = slow
    engine_idle(srv.metrics_url, "the previous tests")
    model = httpx.get(gw.openai_url + "/v1/models", timeout=10).json()["data"][0]["id"]
    completion_id = None
    with httpx.stream("POST", gw.openai_url + "/v1/completions", timeout=60, json={
            "model": model, "prompt": "def parse(lines):\n", "max_tokens": LONG, "min_tokens": LONG,
            "temperature": 1.0, "seed": 9, "stream": True}) as r:
        for i, line in enumerate(r.iter_lines()):
            if line.startswith("data: {"):
                completion_id = completion_id or json.loads(line[len("data: "):])["id"]
            if i >= 3:
                break
    engine_idle(srv.metrics_url, "the client's disconnect")
    assert completion_id and completion_id.startswith("cmpl-")
    assert_stopped_in_the_engine(log_line(srv, completion_id[len("cmpl-"):]), LONG, *GATEWAY_STOPS)
    assert kv_used(srv.metrics_url) == 0


def test_cancelling_speculating_streams_frees_every_block(slow):
    from tests.e2e.helpers import gauge
    from tests.e2e.test_speculation import REPEATING, spec_total

    srv, _ = slow
    engine_idle(srv.metrics_url, "the previous tests")
    before = spec_total(srv.metrics_url, "num_draft_tokens_total")
    s = Stream(srv.grpc_url)
    rids = [s.send(build_inputs(REPEATING, 400, temperature=0.0, min_tokens=400, stream=True),
                   request_id=f"spec-cancel-{i}") for i in range(4)]
    got = 0
    while got < 12:                                             # a few responses in: speculation is under way
        _, chunk = s.pump(timeout=60)
        assert chunk is not None
        got += 1
    wait_until(lambda: spec_total(srv.metrics_url, "num_draft_tokens_total") > before, 10, "drafts verified")
    s.close(cancel=True)
    wait_until(lambda: kv_used(srv.metrics_url) == 0, 15, "every KV block back after cancelling mid-speculation")
    assert gauge(srv.metrics_url, "nv_trt_llm_request_metrics", request_type="active") == 0
    for rid in rids:                                            # each was still running when it was cancelled
        assert_stopped_in_the_engine(log_line(srv, rid), 400, "cancelled")
