"""Tracing end to end: a tritonserver of its own, started with OTEL_EXPORTER_OTLP_ENDPOINT pointing at an
OTLP/HTTP receiver in this process (cli/trace_viewer.py), and clients sending W3C traceparents.

Triton 2.51 ends a decoupled model's span when ``execute`` returns, so the llm's own ``llm.generate`` span
(and postprocess's span over a request's responses) outlive their Triton parent span: they are checked to
start inside it and to lie inside the ensemble's span instead. Every other span lies inside its parent.

Sampling (OTEL_TRACES_SAMPLER_ARG=0.25 -> tritonserver rate 4): Triton 2.51 traces one request in four
of those without a traceparent, and every request that carries one (whatever its sampled flag); our
models follow Triton's decision, so a request is traced in every stage or in none.
"""
from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.request

import grpc
import pytest

from tests.e2e.conftest import start_e2e_server, stop_e2e_server
from tests.e2e.helpers import Stream, clean_env, start_gateway
from cli.client import build_inputs
from cli.trace_viewer import OTLPHandler, OTLPReceiver, render_trace
from triton_llm.v1 import llm_service_pb2 as pb
from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc

SKEW_NS = 5_000_000          # processes stamp their own clocks: allow 5 ms
OURS = {"preprocess", "preprocess.tokenize", "llm.generate", "llm.queue", "llm.prefill", "llm.decode", "postprocess"}
TRITONS = {"InferRequest", "ensemble", "preprocess", "llm", "postprocess"}
ASYNC = {"llm.generate", "postprocess"}   # ours, continuing after Triton's span of the call that started them
PROMPTS = ["def add(a, b):", "import os\n", "class Queue:\n", "while True:\n", "# read a file\n", "x = {}\n",
           "try:\n    ", "def main():\n"]


class _ControlledHandler(OTLPHandler):
    def do_POST(self):  # noqa: N802
        if self.server.hanging.is_set():          # a collector that accepts and never answers
            self.server.held += 1
            self.server.release.wait(120)
            self.close_connection = True
            return
        super().do_POST()


class ControlledReceiver(OTLPReceiver):
    def __init__(self, port: int = 0):
        super().__init__("127.0.0.1", port, handler=_ControlledHandler)
        self.hanging, self.release, self.held = threading.Event(), threading.Event(), 0


def ours(span) -> bool:
    return "triton.model_name" in span.resource      # our models set it on their resource; Triton does not


@pytest.fixture(scope="module")
def traced(model_path, tmp_path_factory):
    receiver = ControlledReceiver().start()
    port = receiver.server_address[1]
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_SERVICE_NAME": "triton-llm-e2e",
           "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25",
           "OTEL_BSP_SCHEDULE_DELAY": "500"}   # exports within half a second (the default waits up to 5 s)
    srv = start_e2e_server(tmp_path_factory.mktemp("traced"), model_path, env=env)
    state = {"receiver": receiver, "port": port, "srv": srv, "texts": {}}
    yield state
    state["receiver"].release.set()
    try:
        stop_e2e_server(srv)
    finally:
        state["receiver"].stop()


def traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def run_traced(url: str, prompts: list[str], max_tokens: int = 12):
    """Each prompt on its own stream with its own traceparent, all at once; [(trace id, parent span id, Result)]."""
    calls = []
    for p in prompts:
        trace_id, span_id, header = traceparent()
        s = Stream(url, headers={"traceparent": header})
        rid = s.send(build_inputs(p, max_tokens, temperature=0.0, stream=True, exclude_input_in_output=True))
        calls.append((trace_id, span_id, s, rid))
    out = []
    for trace_id, span_id, s, rid in calls:
        try:
            out.append((trace_id, span_id, s.wait([rid], 120)[rid]))
        finally:
            s.close()
    return out


def run_traced_to_completion(srv, store, prompts: list[str], max_tokens: int = 12, timeout: float = 60.0):
    """``run_traced``, then wait until every call's trace is complete.

    Seen in a few runs: tritonserver 2.51 traced one of several simultaneous streams under a trace of its own,
    ignoring that stream's traceparent (no span of ours or Triton's under the client's id, and the llm model never
    saw that context). Such a request is sent again, alone, with a new traceparent; at most one in four (at least
    one) may be dropped so, and a trace that arrived in part fails at once with what is missing."""
    calls = run_traced(srv.grpc_url, prompts, max_tokens)
    if not store.wait_for(lambda st: all(complete(st.trace(t)) for t, _, _ in calls), timeout):
        dropped = [i for i, (t, _, _) in enumerate(calls) if not store.trace(t)]
        assert len(dropped) <= max(1, len(calls) // 4), missing_report(srv, store, [t for t, _, _ in calls])
        for i in dropped:
            calls[i], = run_traced(srv.grpc_url, [prompts[i]], max_tokens)
        assert store.wait_for(lambda st: all(complete(st.trace(t)) for t, _, _ in calls), timeout), \
            missing_report(srv, store, [t for t, _, _ in calls])
    return calls


def names(spans) -> tuple[set, set]:
    return {s.name for s in spans if ours(s)}, {s.name for s in spans if not ours(s)}


def complete(spans) -> bool:
    mine, triton = names(spans)
    return mine >= OURS and triton >= TRITONS


def within(child, parent) -> bool:
    return parent.start_ns - SKEW_NS <= child.start_ns and child.end_ns <= parent.end_ns + SKEW_NS


def missing_report(srv, store, trace_ids: list[str]) -> str:
    """Why traces are incomplete: what arrived, whether the llm model saw each trace's context (its log
    line's trace_id), and what else the receiver got."""
    logged = set()
    for line in srv.log_path.read_text(errors="replace").splitlines():
        if line.startswith('{"event":"request_finished"'):
            logged.add(json.loads(line)["trace_id"])
    lines = [f"receiver: {store.requests} exports, {store.errors} unreadable; "
             f"{len(set(store.trace_ids()) - set(trace_ids))} other traces"]
    for t in trace_ids:
        spans = store.trace(t)
        mine, triton = names(spans)
        lines.append(f"{t}: {len(spans)} spans; llm saw this context: {t in logged}; "
                     f"missing ours {sorted(OURS - mine)}, missing Triton's {sorted(TRITONS - triton)}")
    return "\n".join(lines + [render_trace(store.trace(t)) for t in trace_ids])


def set_trace(srv, **settings) -> dict:
    """Triton's trace settings API (POST /v2/trace/setting): change level and rate at run time."""
    req = urllib.request.Request(f"http://{srv.http_url}/v2/trace/setting", data=json.dumps(settings).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_one_trace_per_request_rooted_at_the_clients_span(traced):
    srv, store = traced["srv"], traced["receiver"].store
    calls = run_traced_to_completion(srv, store, PROMPTS)
    for trace_id, _, res in calls:
        assert res.error is None and res.num_final == 1, res.error
    for (trace_id, client_span, res), prompt in zip(calls, PROMPTS):
        traced["texts"][prompt] = res.text
        spans = store.trace(trace_id)
        view = render_trace(spans)
        by_id = {s.span_id: s for s in spans}
        assert len(by_id) == len(spans), view
        # a tree rooted at the client's span: one span hangs from it, every other from a span of the trace
        roots = [s for s in spans if s.parent_id == client_span]
        assert [r.name for r in roots] == ["InferRequest"], view
        assert all(s.parent_id in by_id for s in spans if s is not roots[0]), view
        ensemble, = [s for s in spans if s.name == "ensemble"]
        for s in spans:
            if s is roots[0]:
                continue
            parent = by_id[s.parent_id]
            if ours(s) and s.name in ASYNC:
                assert parent.start_ns - SKEW_NS <= s.start_ns <= parent.end_ns + SKEW_NS, (s.name, view)
                assert within(s, ensemble), (s.name, view)
            else:
                assert within(s, parent), (s.name, parent.name, view)
        mine = {s.name: s for s in spans if ours(s)}
        triton_parent = {s.name: by_id[s.parent_id].name for s in mine.values()}
        assert triton_parent == {"preprocess": "preprocess", "preprocess.tokenize": "preprocess",
                                 "llm.generate": "llm", "llm.queue": "llm.generate", "llm.prefill": "llm.generate",
                                 "llm.decode": "llm.generate", "postprocess": "postprocess"}, view
        assert not ours(by_id[mine["llm.generate"].parent_id]) and not ours(by_id[mine["postprocess"].parent_id])
        gen, decode = mine["llm.generate"], mine["llm.decode"]
        assert decode.attributes["gen_ai.usage.output_tokens"] == res.num_output_tokens, view
        assert gen.attributes["gen_ai.usage.output_tokens"] == res.num_output_tokens
        assert gen.attributes["gen_ai.usage.input_tokens"] == mine["preprocess"].attributes["gen_ai.usage.input_tokens"]
        assert gen.attributes["gen_ai.request.max_tokens"] == 12
        assert list(gen.attributes["gen_ai.response.finish_reasons"]) == [res.finish_reason]
        assert mine["llm.prefill"].end_ns == decode.start_ns and mine["llm.queue"].start_ns == gen.start_ns
        assert [e[0] for e in mine["llm.prefill"].events] == ["prefill_chunk"]
        assert mine["postprocess"].attributes["gen_ai.usage.output_tokens"] == res.num_output_tokens
        assert {s.service for s in mine.values()} >= {"triton-llm-e2e/llm", "triton-llm-e2e/preprocess",
                                                      "triton-llm-e2e/postprocess"}
    # the client's trace id is in each request's log line
    log = srv.log_path.read_text(errors="replace")
    lines = [json.loads(x) for x in log.splitlines() if x.startswith('{"event":"request_finished"')]
    logged = {d["trace_id"] for d in lines}
    assert {t for t, _, _ in calls} <= logged


def test_through_the_gateway_one_tree_under_its_server_span(traced, tmp_path):
    """client -> the gateway's SERVER span -> Triton's InferRequest -> ensemble -> each model -> our spans."""
    srv, store = traced["srv"], traced["receiver"].store
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=traced["receiver"].endpoint, OTEL_SERVICE_NAME="triton-llm-e2e",
                    OTEL_BSP_SCHEDULE_DELAY="500")
    gw = start_gateway(srv, tmp_path, env=env)
    trace_id, client_span, header = traceparent()

    def at_gateway(span) -> bool:
        return span.resource.get("triton_llm.component") == "gateway"
    try:
        with grpc.insecure_channel(gw.target) as channel:
            request = pb.GenerateRequest(prompt=PROMPTS[0], max_tokens=12, temperature=0.0, stream=True,
                                         exclude_input_in_output=True)
            out = list(pb_grpc.LLMServiceStub(channel).Generate(request, metadata=(("traceparent", header),),
                                                                 timeout=120))
        # wait with the gateway up: stopping it cancels the upstream stream it is still closing, and then
        # tritonserver 2.51 never exports that request's InferRequest span
        assert store.wait_for(lambda st: complete(st.trace(trace_id)) and any(map(at_gateway, st.trace(trace_id))),
                              60), render_trace(store.trace(trace_id))
    finally:
        assert gw.stop() == 0, gw.log_tail()
    spans = store.trace(trace_id)
    view = render_trace(spans)
    print("\n" + view)
    by_id = {s.span_id: s for s in spans}
    server, = [s for s in spans if at_gateway(s)]
    assert server.name == "triton_llm.v1.LLMService/Generate" and server.service == "triton-llm-e2e/gateway", view
    assert [s.name for s in spans if s.parent_id == client_span] == [server.name], view
    assert [s.name for s in spans if s.parent_id == server.span_id] == ["InferRequest"], view
    assert all(s.parent_id in by_id for s in spans if s is not server), view
    # every stage starts within the gateway's call; ours end before it does (their last act precedes the final
    # response), Triton's own may end a little after it (they close once the final response is sent)
    assert all(server.start_ns - SKEW_NS <= s.start_ns <= server.end_ns for s in spans), view
    assert all(within(s, server) for s in spans if ours(s)), view
    parent_of = {s.name: by_id[s.parent_id].name for s in spans if s is not server and ours(s)}
    assert parent_of == {"preprocess": "preprocess", "preprocess.tokenize": "preprocess", "llm.generate": "llm",
                         "llm.queue": "llm.generate", "llm.prefill": "llm.generate", "llm.decode": "llm.generate",
                         "postprocess": "postprocess"}, view
    assert by_id[by_id[next(s for s in spans if s.name == "llm.generate").parent_id].parent_id].name == "ensemble"
    mine = {s.name: s for s in spans if ours(s)}
    a, usage = server.attributes, out[-1].usage
    assert (a["rpc.system"], a["rpc.service"], a["rpc.method"], a["rpc.grpc.status_code"]) == \
        ("grpc", "triton_llm.v1.LLMService", "Generate", 0)
    assert a["gen_ai.operation.name"] == "text_completion" and a["gen_ai.request.max_tokens"] == 12
    assert a["gen_ai.request.temperature"] == 0.0 and server.status == "UNSET"
    assert a["gen_ai.request.model"] == mine["llm.generate"].attributes["gen_ai.request.model"]
    assert a["gen_ai.usage.input_tokens"] == usage.prompt_tokens == \
        mine["preprocess"].attributes["gen_ai.usage.input_tokens"]
    assert a["gen_ai.usage.output_tokens"] == usage.completion_tokens == \
        mine["llm.decode"].attributes["gen_ai.usage.output_tokens"]
    assert list(a["gen_ai.response.finish_reasons"]) == list(mine["llm.generate"].attributes[
        "gen_ai.response.finish_reasons"])


def run_untraced(url: str, prompt: str, max_tokens: int = 4):
    with Stream(url) as s:
        rid = s.send(build_inputs(prompt, max_tokens, temperature=0.0, stream=True))
        return s.wait([rid], 120)[rid]


def test_sampling_follows_tritons_rate_and_is_never_partial(traced):
    srv, store = traced["srv"], traced["receiver"].store
    time.sleep(2)                 # let earlier tests' spans arrive, then start counting afresh
    store.clear()
    results = [run_untraced(srv.grpc_url, PROMPTS[i % len(PROMPTS)]) for i in range(16)]
    assert all(r.error is None and r.num_final == 1 for r in results)
    time.sleep(3)                 # longer than every exporter's batch delay
    assert store.wait_for(lambda st: all(complete(st.trace(t)) for t in st.trace_ids()), 10), \
        "a partial trace:\n" + "\n".join(render_trace(store.trace(t)) for t in store.trace_ids())
    assert len(store.trace_ids()) == 4, f"{len(store.trace_ids())} of 16 requests traced at ratio 0.25"

    # a client's traceparent is always honoured (Triton 2.51 traces it whatever the rate)
    run_traced_to_completion(srv, store, PROMPTS[:3], max_tokens=4, timeout=30)

    try:
        set_trace(srv, trace_level=["OFF"])        # the sampler off: nothing at all
        store.clear()
        off = run_traced(srv.grpc_url, PROMPTS[:3], max_tokens=4)
        off_plain = [run_untraced(srv.grpc_url, p) for p in PROMPTS[:4]]
        assert all(res.error is None for _, _, res in off) and all(r.error is None for r in off_plain)
        time.sleep(3)
        assert store.trace_ids() == []
    finally:
        set_trace(srv, trace_level=["TIMESTAMPS"])


def reference_texts(traced) -> dict:
    """Each prompt's greedy text with a healthy collector: the first test's, or made now (xdist may run these
    tests on a fresh module fixture)."""
    if set(traced["texts"]) != set(PROMPTS):
        for (_, _, res), prompt in zip(run_traced(traced["srv"].grpc_url, PROMPTS), PROMPTS):
            assert res.error is None and res.num_final == 1, res.error
            traced["texts"][prompt] = res.text
    return traced["texts"]


def _unchanged_under(traced, what: str):
    srv = traced["srv"]
    t0 = time.perf_counter()
    calls = run_traced(srv.grpc_url, PROMPTS)
    took = time.perf_counter() - t0
    for (_, _, res), prompt in zip(calls, PROMPTS):
        assert res.error is None and res.num_final == 1, (what, res.error)
        assert res.text == traced["texts"][prompt], f"{what}: the output changed"
    print(f"\n8 concurrent traced requests with the collector that {what}: {took:.2f}s")
    return calls


def test_a_hanging_collector_does_not_break_serving(traced):
    reference_texts(traced)
    receiver = traced["receiver"]
    receiver.hanging.set()
    try:
        _unchanged_under(traced, "hangs")
        time.sleep(1.5)
        assert receiver.held > 0, "no exporter reached the hanging collector"
    finally:
        receiver.hanging.clear()
        receiver.release.set()


def test_a_refusing_collector_does_not_break_serving_and_tracing_recovers(traced):
    reference_texts(traced)
    traced["receiver"].stop()                     # the port now refuses connections
    _unchanged_under(traced, "refuses connections")
    receiver = ControlledReceiver(traced["port"]).start()
    traced["receiver"] = receiver
    (trace_id, _, res), = run_traced(traced["srv"].grpc_url, PROMPTS[:1])
    assert res.error is None
    # exporters back off after refused connections: allow them time to come back on a loaded machine
    assert receiver.store.wait_for(lambda st: complete(st.trace(trace_id)), 90), render_trace(receiver.store.trace(trace_id))
