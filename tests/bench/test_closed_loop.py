"""bench/harness/closed_loop.py without a server: stream consumption, both closed loops, side-by-side levels.

Behaviour only (fake streams, fake clocks, a fake engine); no wall-clock goals.
"""
from __future__ import annotations

import asyncio
import math
import threading
from dataclasses import dataclass

from bench.harness import closed_loop as cl
from bench.harness.stats import RequestRecord
from bench.harness.workload import BenchRequest, WorkItem, request_values
from cli.client import Chunk


class FakeClock:
    def __init__(self, times):
        self.times = iter(times)

    def __call__(self):
        return next(self.times)


async def _aiter(items):
    for item in items:
        yield item


def test_consume_counts_tokens_from_cumulative_num_output_tokens():
    stream = [(Chunk("a", "", False, 1), None), (Chunk("", "", False, 1), None),  # held-back text, no new token
              (Chunk("bc", "", False, 3), None), (Chunk("d", "length", True, 4), None),
              (Chunk("", "", True), None)]  # never read: the request is over at its final response
    rec = RequestRecord(start=0.0)
    asyncio.run(cl.consume(_aiter(stream), rec, parse=lambda c: c, now=FakeClock([1.0, 2.0, 3.0, 4.0])))
    assert rec.events == [(1.0, 1), (3.0, 2), (4.0, 1)]
    assert (rec.text, rec.finish_reason, rec.end, rec.error, rec.tokens) == ("abcd", "length", 4.0, None, 4)


def test_consume_records_errors_and_streams_closed_early():
    class Err(Exception):
        def message(self):
            return "max_tokens: must be >= 1, got 0"

    rec = RequestRecord(start=0.0)
    asyncio.run(cl.consume(_aiter([(None, Err())]), rec, parse=lambda c: c, now=FakeClock([1.0])))
    assert rec.error == "max_tokens: must be >= 1, got 0" and rec.end == 1.0
    rec = RequestRecord(start=0.0)
    asyncio.run(cl.consume(_aiter([(Chunk("x", "", False, 1), None)]), rec, parse=lambda c: c,
                           now=FakeClock([1.0, 2.0])))
    assert rec.error == "stream closed before a final response" and rec.tokens == 1


@dataclass
class _Out:
    new_token_ids: list
    request_finished: bool = False
    finish_reason: str | None = None
    error: str | None = None


class FakeEngine:
    """Emits each request's tokens one by one from a thread; tracks the most requests in flight."""

    def __init__(self):
        self.lock = threading.Lock()
        self.in_flight = 0
        self.peak = 0
        self.ids = []
        self.params = []

    def add_request(self, rid, prompt_ids, params, cb):
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.ids.append(rid)
            self.params.append(params)

        def run():
            for t in range(params.max_tokens):
                last = t == params.max_tokens - 1
                if last:
                    with self.lock:
                        self.in_flight -= 1
                cb(_Out([t], request_finished=last, finish_reason="length" if last else None))
        threading.Thread(target=run, daemon=True).start()

    def abort(self, rid):
        return False


@dataclass(frozen=True)
class _Params:
    max_tokens: int


def test_engine_level_is_a_bounded_closed_loop():
    items = [WorkItem(f"p{i}", 3 + i % 2, (0, 5, 6), _Params(3 + i % 2)) for i in range(7)]
    engine = FakeEngine()
    recs, secs = cl.run_engine_level(engine, items, 3, level_seconds=60, request_timeout=10)
    assert len(recs) == 7 and len(set(engine.ids)) == 7 and engine.peak <= 3
    assert [r.tokens for r in recs] == [it.max_tokens for it in items]  # aligned with the items
    assert all(r.finish_reason == "length" and r.error is None for r in recs) and secs > 0
    recs, _ = cl.run_engine_level(FakeEngine(), items, 2, level_seconds=-1, request_timeout=10)
    assert recs == [None] * 7  # past the level's time: nothing new is submitted


def test_engine_benchmark_runs_the_same_closed_loop():
    """bench_engine's ``run_engine`` drives ``run_engine_level`` with greedy, EOS-ignoring requests."""
    from bench import bench_engine

    reqs = [BenchRequest([1, 2, 3], 2 + i % 3) for i in range(6)]
    engine = FakeEngine()
    out = bench_engine.run_engine(engine, reqs, 2)
    assert engine.peak <= 2 and len(engine.ids) == 6
    assert out["tokens"] == sum(r.max_tokens for r in reqs) and out["tok_per_s"] > 0
    assert all(p.temperature == 0.0 and p.ignore_eos and p.max_tokens == r.max_tokens
               for p, r in zip(engine.params, reqs))
    assert set(out) == {"tokens", "seconds", "tok_per_s", "ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms"}


def test_segments_alternate_sides_when_halves_fill_the_concurrency():
    assert cl.segments(8, 1) == [("pipeline", 0, 4), ("engine", 0, 4), ("engine", 4, 8), ("pipeline", 4, 8)]
    assert cl.segments(48, 32) == [("pipeline", 0, 48), ("engine", 0, 48)]
    assert cl.segments(8, 1, ("pipeline",)) == [("pipeline", 0, 8)]
    assert cl.segments(8, 1, ("spec", "plain"))[:2] == [("spec", 0, 4), ("plain", 0, 4)]
    for n, c in ((8, 4), (9, 4), (32, 16), (48, 32)):
        order = cl.segments(n, c)
        for side in ("pipeline", "engine"):  # each side runs every request exactly once
            assert sorted(i for s, lo, hi in order if s == side for i in range(lo, hi)) == list(range(n))


def _replay(log):
    """A runner that records what it was asked and finishes each item with one token at once."""
    async def run(items, concurrency, level_seconds):
        log.append((list(items), concurrency, level_seconds))
        return [RequestRecord(start=0.0, events=[(0.01, 1)], end=0.01) for _ in items], 0.5
    return run


def test_sweep_runs_every_side_on_every_item_and_stops_at_the_deadline():
    a_log, b_log, shown = [], [], []
    workloads = {1: list(range(8)), 4: list(range(4))}
    rows = asyncio.run(cl.sweep(workloads, {"a": _replay(a_log), "b": _replay(b_log)}, level_seconds=80,
                                deadline=math.inf, annotate=lambda row, run, items: row.update(n=len(items)),
                                show=shown.append))
    assert [r["concurrency"] for r in rows] == [1, 4] and shown == rows
    assert rows[0]["order"] == ["a[0:4]", "b[0:4]", "b[4:8]", "a[4:8]"]
    assert [(items, c, secs) for items, c, secs in a_log[:2]] == [([0, 1, 2, 3], 1, 40.0), ([4, 5, 6, 7], 1, 40.0)]
    assert sorted(i for items, _, _ in b_log[:2] for i in items) == list(range(8))
    assert rows[0]["a"]["requests"] == 8 and rows[0]["a"]["seconds"] == 1.0 and rows[0]["n"] == 8
    assert rows[1]["b"]["output_tokens"] == 4
    assert asyncio.run(cl.sweep(workloads, {"a": _replay([])}, level_seconds=1, deadline=-math.inf)) == []


def _infer_result(tokens: int, text: str, reason: str, final: bool):
    """A real tritonclient InferResult, encoded as the server sends it."""
    import numpy as np
    from tritonclient.grpc import InferResult, service_pb2
    from tritonclient.utils import serialize_byte_tensor

    resp = service_pb2.ModelInferResponse(model_name="ensemble")
    for name, dtype, arr in (("text_output", "BYTES", np.array([[text.encode()]], dtype=np.object_)),
                             ("finish_reason", "BYTES", np.array([[reason.encode()]], dtype=np.object_)),
                             ("num_output_tokens", "INT32", np.array([[tokens]], dtype=np.int32)),
                             ("num_input_tokens", "INT32", np.array([[3]], dtype=np.int32))):
        out = resp.outputs.add(name=name, datatype=dtype, shape=[1, 1])
        raw = serialize_byte_tensor(arr).item() if dtype == "BYTES" else arr.tobytes()
        resp.raw_output_contents.append(raw)
    resp.parameters["triton_final_response"].bool_param = final
    return InferResult(resp)


class FakeAioClient:
    """``stream_infer`` like tritonclient.grpc.aio: one request per stream, two tokens per response."""

    def __init__(self):
        self.in_flight = 0
        self.peak = 0
        self.requests = []

    def stream_infer(self, inputs_iterator, stream_timeout=None):
        client = self

        class Call:
            def __init__(self):
                self.pending = None

            def __aiter__(self):
                return self

            async def __anext__(self):
                if self.pending is None:
                    req = await inputs_iterator.__anext__()
                    client.requests.append(req)
                    client.in_flight += 1
                    client.peak = max(client.peak, client.in_flight)
                    self.pending = [_infer_result(k, "ab", "length" if k == 4 else "", k == 4) for k in (2, 4)]
                if self.pending:
                    await asyncio.sleep(0.001)
                    result = self.pending.pop(0)
                    if not self.pending:
                        client.in_flight -= 1
                    return result, None
                try:  # the request side ends once the client has its final response; then the stream closes
                    await inputs_iterator.__anext__()
                except StopAsyncIteration:
                    pass
                raise StopAsyncIteration

            def cancel(self):
                return True

        return Call()


def test_pipeline_level_streams_with_trt_llm_inputs_and_bounded_concurrency():
    items = [WorkItem(f"def f{i}():", 4) for i in range(6)]
    client = FakeAioClient()
    recs, secs = asyncio.run(cl.run_pipeline_level(client, items, 2, model="ensemble", level_seconds=60,
                                                   request_timeout=10))
    assert client.peak == 2 and len(client.requests) == 6
    assert all(r is not None and r.error is None and not r.stream_cancelled for r in recs)
    assert [(len(r.events), r.tokens, r.text, r.finish_reason, r.num_input_tokens) for r in recs] == \
        [(2, 4, "abab", "length", 3)] * 6
    req = client.requests[0]
    assert req["model_name"] == "ensemble"
    types = {i.name(): i.datatype() for i in req["inputs"]}
    assert types == {"text_input": "BYTES", "max_tokens": "INT32", "stream": "BOOL", "temperature": "FP32",
                     "min_tokens": "INT32", "exclude_input_in_output": "BOOL", "return_num_output_tokens": "BOOL",
                     "return_num_input_tokens": "BOOL"}
    v = request_values("x", 7)
    assert (v["stream"], v["temperature"], v["min_tokens"], v["exclude_input_in_output"]) == (True, 0.0, 7, True)


def test_pipeline_runner_sends_extra_inputs():
    items = [WorkItem("{", 4, extra={"guided_decoding_guide_type": "json", "guided_decoding_guide": "{}"})]
    client = FakeAioClient()
    run = cl.pipeline_runner(client, model="ensemble", request_timeout=10)
    recs, _ = asyncio.run(run(items, 1, 60))
    assert recs[0].tokens == 4
    types = {i.name(): i.datatype() for i in client.requests[0]["inputs"]}
    assert types["guided_decoding_guide_type"] == "BYTES" and types["max_tokens"] == "INT32"
