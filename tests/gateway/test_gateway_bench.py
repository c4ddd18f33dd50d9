"""bench/bench_gateway.py's gateway side without a server: records and the closed loop, on a fake Triton."""
from __future__ import annotations

import asyncio

import grpc

from bench import bench_gateway as bg
from bench.harness.workload import WorkItem
from gateway import server as gw_server
from gateway.config import GatewayConfig
from tests.gateway.fake_triton import FakeTriton, error, response, start_fake
from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc


def test_gateway_request_records_tokens_and_errors():
    def script(req):
        if req.raw_input_contents[0].endswith(b"bad"):
            return [error("in ensemble 'ensemble', top_p: must be <= 1.0, got 2.0")]
        return [response("a", n_out=1), response("bcd", n_out=4), response("e", n_out=5, finish="length", final=True)]

    async def body():
        fake_server, port = await start_fake(FakeTriton(script=script))
        gw = await gw_server.start(GatewayConfig(listen="127.0.0.1:0", triton_url=f"127.0.0.1:{port}"))
        try:
            async with grpc.aio.insecure_channel(f"localhost:{gw.port}") as ch:
                stub = pb_grpc.LLMServiceStub(ch)
                items = [WorkItem("ok", 5), WorkItem("ok", 5), WorkItem("bad", 5)]
                records, secs = await bg.closed_loop(items, 2, lambda it: bg.gateway_request(stub, it, timeout=10))
        finally:
            await gw.stop(grace=0)
            await fake_server.stop(0)
        ok, _, bad = records
        assert [n for _, n in ok.events] == [1, 3, 1] and ok.tokens == 5 and ok.text == "abcde"
        assert ok.finish_reason == "FINISH_REASON_LENGTH" and ok.error is None and ok.end >= ok.events[-1][0]
        assert bad.error.startswith("INVALID_ARGUMENT") and not bad.events
        assert secs > 0

    asyncio.run(asyncio.wait_for(body(), 30))


def test_run_level_alternates_sides_per_segment_on_the_same_items():
    from bench.harness.stats import RequestRecord

    calls = []

    def side(name):
        async def one(item):
            calls.append((name, item.text))
            return RequestRecord(start=0.0, events=[(0.1, 1), (0.2, 1)], end=0.2, text=item.text.upper())
        return one

    items = [WorkItem(f"p{i}", 2) for i in range(5)]
    row = asyncio.run(bg.run_level(items, 1, {"direct": side("direct"), "gateway": side("gateway")}, segment=2))
    assert calls == [("direct", "p0"), ("direct", "p1"), ("gateway", "p0"), ("gateway", "p1"),
                     ("gateway", "p2"), ("gateway", "p3"), ("direct", "p2"), ("direct", "p3"),
                     ("direct", "p4"), ("gateway", "p4")]
    assert row["direct"]["completed"] == row["gateway"]["completed"] == 5 and row["identical_text"] == 5
    assert row["paired_tpot_ratio_p50"] == 1.0 and len(row["segment_throughput_ratios"]) == 3


def test_openai_request_records_chunks_as_tokens_and_errors():
    import httpx

    from bench.harness.openai_client import openai_request
    from tests.gateway.openai_harness import FAKE_PARAMS, MODEL, served

    def script(req):
        if b"bad" in req.raw_input_contents[0]:
            return [error("in ensemble 'ensemble', top_p: must be <= 1.0, got 2.0")]
        return [response("a", n_out=1), response("bcd", n_out=4), response("e", n_out=5, finish="length", final=True)]

    with served(FakeTriton(llm_parameters=dict(FAKE_PARAMS), script=script)) as s:
        async def body():
            async with httpx.AsyncClient() as http:
                ok = await openai_request(http, s.base_url, MODEL, WorkItem("ok", 5), timeout=10)
                bad = await openai_request(http, s.base_url, MODEL, WorkItem("bad", 5), timeout=10)
            return ok, bad
        ok, bad = asyncio.run(body())
    assert [n for _, n in ok.events] == [1, 1, 3] and ok.tokens == 5 and ok.text == "abcde"
    assert ok.finish_reason == "length" and ok.error is None and ok.num_input_tokens == 4
    assert bad.error.startswith("HTTP 400") and not bad.events
    assert s.fake.requests and {"min_tokens", "max_tokens"} <= {t.name for t in s.fake.requests[0].inputs}
