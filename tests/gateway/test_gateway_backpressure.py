"""The gateway under slow clients, full engines and deadlines, against a fake Triton: a slow client's output is
coalesced up to a cap then its stream ends with RESOURCE_EXHAUSTED; the engine's queue cap becomes
RESOURCE_EXHAUSTED with a RetryInfo; an abandoned request gets a ``stop`` request. gateway/stream_buffer.py's
invariants are checked directly. The same faults against the real tritonserver: tests/faults/."""
from __future__ import annotations

import asyncio

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from gateway.stream_buffer import RESPONSE_OVERHEAD, StreamBuffer, coalesced_bytes
from tests.gateway.fake_triton import FakeTriton, collect, decode_input, error, harness, inputs_of, response, run
from tests.gateway.test_gateway_service import REQ, status_of, until
from triton_llm.v1 import llm_service_pb2 as pb
from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc

# A client whose HTTP/2 window stays small, so that what it does not read waits in the gateway.
SMALL_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]


def delta(text: str, seq: int = 0, **kw) -> pb.GenerateResponse:
    return pb.GenerateResponse(text=text, sequence_index=seq, log_probs=[-1.0] * len(text), **kw)


def test_the_buffer_coalesces_a_sequences_deltas_and_never_passes_its_cap():
    async def body():
        buf = StreamBuffer(cap_bytes=200)
        pushed = []
        for i in range(100):
            ok = buf.push(delta("ab", seq=i // 40, num_output_tokens=i))
            assert buf.bytes <= buf.cap_bytes and buf.peak_bytes <= buf.cap_bytes
            if not ok:
                break
            pushed.append(i)
        assert 10 < len(pushed) < 100               # refused once full, having held what fits
        first = await buf.get()                     # everything of sequence 0 in one response
        assert first.text == "ab" * len(pushed) and len(first.log_probs) == 2 * len(pushed)
        assert first.num_output_tokens == pushed[-1]
        assert buf.bytes == 0
        buf.push(delta("x", finish_reason=pb.FINISH_REASON_LENGTH))
        buf.push(delta("y"))                        # a finished response is never extended
        buf.close()
        assert [(await buf.get()).text, (await buf.get()).text, await buf.get()] == ["x", "y", None]
        assert coalesced_bytes(delta("é")) == 2 + 4 and RESPONSE_OVERHEAD > 0
    asyncio.run(body())


def test_top_logprob_alternatives_count_against_the_cap():
    """20 alternatives a token weigh far more than its text: they count at their encoded size, so a stream asking
    for them reaches the cap as soon as what waits passes it, and the joined response keeps every position."""
    top = pb.TopLogprobs(candidates=[pb.TokenLogprob(token_id=i, token=f"tok{i}", log_prob=-i) for i in range(20)])
    one = pb.GenerateResponse(text="a", sequence_index=0, log_probs=[-1.0], top_log_probs=[top])
    assert coalesced_bytes(one) == 1 + 4 + top.ByteSize() and top.ByteSize() > 200

    async def body():
        buf = StreamBuffer(cap_bytes=10 * coalesced_bytes(one) + RESPONSE_OVERHEAD)
        pushed = 0
        while buf.push(pb.GenerateResponse.FromString(one.SerializeToString())):   # a fresh delta each time
            pushed += 1
        assert pushed == 10 and buf.peak_bytes <= buf.cap_bytes
        joined = await buf.get()
        assert joined.text == "a" * 10 and len(joined.top_log_probs) == 10
    asyncio.run(body())


def test_a_failed_buffer_drops_what_waits_and_raises():
    async def body():
        buf = StreamBuffer(cap_bytes=100)
        buf.push(delta("a"))
        buf.fail(RuntimeError("gone"))
        assert buf.bytes == 0
        with pytest.raises(RuntimeError, match="gone"):
            await buf.get()
    asyncio.run(body())


def stop_requests(fake: FakeTriton) -> list[str]:
    out = []
    for req in fake.requests:
        inputs = inputs_of(req)
        if "stop" in inputs and decode_input("BOOL", inputs["stop"][2]) == [True]:
            out.append(req.id)
    return out


def test_a_deadline_sends_a_stop_request_for_the_request():
    async def body():
        fake = FakeTriton(script=lambda r: [response("a"), "hang"] if "stop" not in inputs_of(r)
                          else [response(final=True)])
        async with harness(fake) as (gw, stub, _, _):
            req = pb.GenerateRequest(prompt="x", max_tokens=4, stream=True, request_id="dl-1")
            err = await status_of(stub.Generate(req, timeout=0.3))
            assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await until(lambda: stop_requests(fake) == ["dl-1"], what="a stop request for dl-1")
    run(body())


def test_a_finished_request_gets_no_stop_request():
    async def body():
        fake = FakeTriton()
        async with harness(fake) as (gw, stub, _, _):
            out = await collect(stub.Generate(REQ))
            assert out[-1].usage.completion_tokens == 2
            await asyncio.sleep(0.2)
            assert stop_requests(fake) == []
    run(body())


def test_the_engines_queue_cap_is_resource_exhausted_with_a_retry_delay():
    async def body():
        full = ("in ensemble 'ensemble', max_queued_requests: the engine is full (16 requests: max_num_seqs 8 "
                "running + max_queued_requests 8 waiting); unavailable, retry later")
        fake = FakeTriton(script=lambda r: [error(full)])
        async with harness(fake) as (gw, stub, _, _):
            err = await status_of(stub.Generate(REQ))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_queued_requests" in err.details()
            (value,) = [v for k, v in err.trailing_metadata() if k == "grpc-status-details-bin"]
            info = error_details_pb2.RetryInfo()
            assert status_pb2.Status.FromString(value).details[0].Unpack(info)
            assert info.retry_delay.ToMilliseconds() == 1000
            assert stop_requests(fake) == []     # the engine ended it: nothing to stop
    run(body())


def test_a_client_too_slow_for_the_buffer_ends_with_resource_exhausted_and_triton_is_stopped():
    async def body():
        n = 1000
        fake = FakeTriton(script=lambda r: ([response("tok ", n_out=i) for i in range(n)] + ["hang"])
                          if "stop" not in inputs_of(r) else [response(final=True)])
        async with harness(fake, stream_buffer_bytes=2048) as (gw, _, _, _), \
                grpc.aio.insecure_channel(f"localhost:{gw.port}", options=SMALL_WINDOW) as channel:
            stub = pb_grpc.LLMServiceStub(channel)
            call = stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=n, stream=True, request_id="slow-1"))
            await call.read()                    # the stream started; then the client stops reading
            await until(lambda: stop_requests(fake) == ["slow-1"], 20, "the gateway stopped the request")
            got, code = 0, None
            try:
                while (msg := await call.read()) is not grpc.aio.EOF:
                    got += len(msg.text) // 4
            except grpc.aio.AioRpcError as e:
                code = e.code()
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert got < n
    run(body())
