"""bench/bench_pipeline.py without a server: statistics, stream consumption, closed loop, config, report.

Behaviour only (fake streams, fake clocks, a fake engine); no wall-clock goals.
"""
from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench import bench_pipeline as bp
from tools.client import Chunk


def test_percentile_interpolates_like_numpy():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert bp.percentile(xs, 50) == 3.0
    assert bp.percentile(xs, 0) == 1.0 and bp.percentile(xs, 100) == 5.0
    assert bp.percentile(xs, 90) == pytest.approx(4.6)
    assert bp.percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert bp.percentile([7.0], 99) == 7.0
    assert bp.percentile([], 50) != bp.percentile([], 50)  # nan


def test_dist_ms_reports_milliseconds_and_none_when_empty():
    d = bp.dist_ms([0.010, 0.020, 0.030])
    assert d["n"] == 3 and d["p50"] == pytest.approx(20.0) and d["mean"] == pytest.approx(20.0)
    assert bp.dist_ms([]) == {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None}


def test_request_metrics_split_multi_token_responses():
    r = bp.RequestRecord(start=10.0, events=[(10.5, 1), (10.7, 1), (11.1, 4)], end=11.2)
    m = bp.request_metrics(r)
    assert m["ttft"] == pytest.approx(0.5)
    assert m["itl"] == pytest.approx([0.2, 0.1, 0.1, 0.1, 0.1])  # 0.4 s over the 4 tokens of the last response
    assert m["tpot"] == pytest.approx(0.6 / 5)                   # (last - first) / (tokens - 1)
    assert m["e2e"] == pytest.approx(1.2)


def test_summarize_counts_tokens_errors_and_throughput():
    ok = bp.RequestRecord(start=0.0, events=[(0.1, 1), (0.2, 1), (0.3, 1)], end=0.3, finish_reason="length")
    failed = bp.RequestRecord(start=0.0, end=0.05, error="boom")
    s = bp.summarize([ok, failed], seconds=2.0)
    assert (s["requests"], s["completed"], s["errors"], s["output_tokens"]) == (2, 1, 1, 3)
    assert s["tok_per_s"] == pytest.approx(1.5) and s["req_per_s"] == pytest.approx(0.5)
    assert s["ttft_ms"]["p50"] == pytest.approx(100.0) and s["tpot_ms"]["p50"] == pytest.approx(100.0)
    assert s["first_error"] == "boom"
    json.dumps(s)  # JSON-ready (no NaN)


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
    rec = bp.RequestRecord(start=0.0)
    asyncio.run(bp.consume(_aiter(stream), rec, parse=lambda c: c, now=FakeClock([1.0, 2.0, 3.0, 4.0])))
    assert rec.events == [(1.0, 1), (3.0, 2), (4.0, 1)]
    assert (rec.text, rec.finish_reason, rec.end, rec.error, rec.tokens) == ("abcd", "length", 4.0, None, 4)


def test_consume_records_errors_and_streams_closed_early():
    class Err(Exception):
        def message(self):
            return "max_tokens: must be >= 1, got 0"

    rec = bp.RequestRecord(start=0.0)
    asyncio.run(bp.consume(_aiter([(None, Err())]), rec, parse=lambda c: c, now=FakeClock([1.0])))
    assert rec.error == "max_tokens: must be >= 1, got 0" and rec.end == 1.0
    rec = bp.RequestRecord(start=0.0)
    asyncio.run(bp.consume(_aiter([(Chunk("x", "", False, 1), None)]), rec, parse=lambda c: c,
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

    def add_request(self, rid, prompt_ids, params, cb):
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.ids.append(rid)

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
    items = [bp.WorkItem(f"p{i}", 3 + i % 2, (0, 5, 6), _Params(3 + i % 2)) for i in range(7)]
    engine = FakeEngine()
    recs, secs = bp.run_engine_level(engine, items, 3, level_seconds=60, request_timeout=10)
    assert len(recs) == 7 and len(set(engine.ids)) == 7 and engine.peak <= 3
    assert [r.tokens for r in recs] == [it.max_tokens for it in items]  # aligned with the items
    assert all(r.finish_reason == "length" and r.error is None for r in recs) and secs > 0
    recs, _ = bp.run_engine_level(FakeEngine(), items, 2, level_seconds=-1, request_timeout=10)
    assert recs == [None] * 7  # past the level's time: nothing new is submitted


def test_segments_alternate_sides_when_halves_fill_the_concurrency():
    assert bp.segments(8, 1) == [("pipeline", 0, 4), ("engine", 0, 4), ("engine", 4, 8), ("pipeline", 4, 8)]
    assert bp.segments(48, 32) == [("pipeline", 0, 48), ("engine", 0, 48)]
    assert bp.segments(8, 1, with_engine=False) == [("pipeline", 0, 8)]
    for n, c in ((8, 4), (9, 4), (32, 16), (48, 32)):
        order = bp.segments(n, c)
        for side in ("pipeline", "engine"):  # each side runs every request exactly once
            assert sorted(i for s, lo, hi in order if s == side for i in range(lo, hi)) == list(range(n))


def test_engine_config_follows_llm_config_pbtxt_and_overrides(tmp_path):
    overrides = bp.repository_overrides(tmp_path, ["llm.max_num_seqs=8", "llm.kv_cache_bytes=4MiB"])
    assert overrides["preprocess"] == {"tokenizer_path": str(tmp_path)}
    assert overrides["postprocess"] == {"tokenizer_path": str(tmp_path)}
    cfg, params = bp.engine_config(overrides)
    assert cfg.model_path == str(tmp_path) and cfg.max_num_seqs == 8 and cfg.kv_cache_bytes == 4 << 20
    text = (bp.MODEL_REPOSITORY / "llm" / "config.pbtxt").read_text()
    file_params = bp.pbtxt_parameters(text)
    assert params["block_size"] == file_params["block_size"]
    assert "cancel_poll_interval_s" in file_params and "cancel_poll_interval_s" not in params  # serving-only
    default_cfg, _ = bp.engine_config({})
    assert Path(default_cfg.model_path).is_absolute()  # relative paths resolve against the repository


def _level(c, p_tok, e_tok, p_tpot, e_tpot):
    side = lambda tok, tpot: {"tok_per_s": tok, "tpot_ms": {"p50": tpot}, "ttft_ms": {"p50": 1.0}}  # noqa: E731
    return {"concurrency": c, "pipeline": side(p_tok, p_tpot), "engine": side(e_tok, e_tpot)}


def test_ratios_use_lowest_and_highest_levels(tmp_path):
    levels = [_level(1, 90, 100, 11.0, 10.0), _level(8, 400, 450, 20.0, 18.0), _level(32, 900, 1000, 30.0, 25.0)]
    r = bp.ratios(levels)
    assert r["tpot_ratio"]["concurrency"] == 1 and r["tpot_ratio"]["ratio"] == pytest.approx(1.1)
    assert r["tpot_ratio"]["meets_goal"] is True
    assert r["throughput_ratio"]["concurrency"] == 32 and r["throughput_ratio"]["ratio"] == pytest.approx(0.9)
    assert r["throughput_ratio"]["meets_goal"] is True
    assert bp.ratios([_level(1, 50, 100, 20.0, 10.0)])["tpot_ratio"]["meets_goal"] is False
    bp.plot(levels, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_requests_per_level_are_bounded():
    assert [bp.requests_for(c, 8, 48) for c in bp.LEVELS] == [8, 8, 16, 32, 48]


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
    items = [bp.WorkItem(f"def f{i}():", 4) for i in range(6)]
    client = FakeAioClient()
    recs, secs = asyncio.run(bp.run_pipeline_level(client, items, 2, model="ensemble", level_seconds=60,
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
    v = bp.request_values("x", 7)
    assert (v["stream"], v["temperature"], v["min_tokens"], v["exclude_input_in_output"]) == (True, 0.0, 7, True)
