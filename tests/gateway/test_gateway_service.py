"""The gateway's server against a fake Triton (tests/gateway/fake_triton.py): auth, limits, readiness,
deadlines and cancellation reaching upstream, trace context, error statuses, TLS, shutdown, reflection.
The same behaviours against the real tritonserver are in tests/e2e/test_gateway.py."""
from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from dataclasses import replace

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway import server as gw_server
from gateway.config import REPO, GatewayConfig
from tests.gateway.fake_triton import FakeTriton, collect, error, harness, response, run, start_fake
from triton_llm.v1 import llm_service_pb2 as pb
from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc

REQ = pb.GenerateRequest(prompt="def f():", max_tokens=4, stream=True)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def status_of(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await collect(call)
    return e.value


def bad_request_field(err: grpc.aio.AioRpcError) -> str | None:
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            bad = error_details_pb2.BadRequest()
            assert status.details[0].Unpack(bad)
            return bad.field_violations[0].field
    return None


async def until(predicate, timeout=5.0, what="condition"):
    t = time.monotonic()
    while not (await predicate() if asyncio.iscoroutinefunction(predicate) else predicate()):
        if time.monotonic() - t > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


# ---- Generate ------------------------------------------------------------------------------------------

def test_generate_streams_and_ends_cleanly():
    async def body():
        async with harness() as (gw, stub, _, fake):
            out = await collect(stub.Generate(REQ))
            assert "".join(m.text for m in out) == "hello world"
            assert out[-1].finish_reason == pb.FINISH_REASON_LENGTH and out[-1].usage.completion_tokens == 2
            assert len(fake.requests) == 1 and fake.requests[0].model_name == "ensemble"
            assert fake.requests[0].id == out[0].request_id and len(out[0].request_id) == 32
            await until(lambda: fake.finished_streams == 1, what="the upstream stream closed by half-close")
            assert fake.cancelled == 0 and gw.service.inflight == 0
    run(body())


def test_client_request_id_is_used_upstream_and_echoed():
    async def body():
        async with harness() as (_, stub, _, fake):
            out = await collect(stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2, request_id="caller-7")))
            assert fake.requests[0].id == "caller-7" and {m.request_id for m in out} == {"caller-7"}
    run(body())


def test_trace_context_is_forwarded_and_credentials_are_not():
    async def body():
        tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        async with harness(auth_tokens=("tok",)) as (_, stub, _, fake):
            md = (("traceparent", tp), ("tracestate", "vendor=1"), ("authorization", "Bearer tok"), ("x-other", "y"))
            await collect(stub.Generate(REQ, metadata=md))
            seen = fake.metadata[0]
            assert seen.get("traceparent") == tp and seen.get("tracestate") == "vendor=1"
            assert "authorization" not in seen and "x-other" not in seen
            await collect(stub.Generate(REQ, metadata=(("authorization", "Bearer tok"),)))
            assert "traceparent" not in fake.metadata[1]
    run(body())


def test_upstream_field_error_is_invalid_argument_with_a_bad_request_detail():
    async def body():
        fake = FakeTriton(script=lambda r: [error("in ensemble 'ensemble', top_p: must be <= 1.0, got 2.0")])
        async with harness(fake) as (gw, stub, _, _):
            err = await status_of(stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2, top_p=2.0)))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.details() == "top_p: must be <= 1.0, got 2.0"
            assert bad_request_field(err) == "top_p"
            assert gw.service.inflight == 0
    run(body())


def test_after_an_upstream_error_the_upstream_stream_is_half_closed_not_cancelled():
    """Triton 2.51 can count an ensemble request as in flight forever when its stream is cancelled right
    after the error response; the gateway half-closes and lets Triton end the stream."""
    async def body():
        fake = FakeTriton(script=lambda r: [error("in ensemble 'ensemble', top_k: must be >= 0, got -1")])
        async with harness(fake) as (_, stub, _, _):
            call = stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2, top_k=-1))
            err = await status_of(call)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            await until(lambda: fake.finished_streams == 1, timeout=2, what="the upstream stream ended by Triton")
            assert fake.cancelled == 0
    run(body())


def test_an_upstream_stream_left_open_after_the_end_is_cancelled_after_the_drain_timeout():
    async def body():
        fake = FakeTriton(script=lambda r: [response("x", finish="length", final=True), "hang"])
        async with harness(fake) as (gw, stub, _, _):
            gw.service.closer.drain_timeout_s = 1.0
            t = time.monotonic()
            out = await collect(stub.Generate(REQ))
            assert out[-1].finish_reason == pb.FINISH_REASON_LENGTH
            assert time.monotonic() - t < 0.5  # the caller does not wait for the drain
            await asyncio.sleep(0.5)
            assert fake.cancelled == 0  # not before the drain timeout
            await until(lambda: fake.cancelled == 1, timeout=3, what="the stuck stream cancelled")
    run(body())


def test_gateway_side_field_errors_never_reach_triton():
    async def body():
        async with harness() as (_, stub, _, fake):
            for req, field in [(pb.GenerateRequest(max_tokens=2), "prompt"),
                               (pb.GenerateRequest(prompt="x", max_tokens=2, request_id="has space"), "request_id"),
                               (pb.GenerateRequest(prompt="x", max_tokens=2, guided_decoding=pb.GuidedDecoding()),
                                "guided_decoding")]:
                err = await status_of(stub.Generate(req))
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith(field + ": ")
                assert bad_request_field(err) == field
            assert fake.requests == []
    run(body())


def test_internal_errors_carry_the_request_id_not_the_upstream_text():
    async def body():
        fake = FakeTriton(script=lambda r: [error("Traceback (most recent call last): File model.py ... secret")])
        async with harness(fake) as (_, stub, _, _):
            err = await status_of(stub.Generate(pb.GenerateRequest(prompt="x", max_tokens=2, request_id="rid-5")))
            assert err.code() == grpc.StatusCode.INTERNAL
            assert "rid-5" in err.details() and "Traceback" not in err.details() and "secret" not in err.details()
    run(body())


def test_stream_closed_without_a_final_response_is_unavailable():
    async def body():
        fake = FakeTriton(script=lambda r: [response("partial"), "close"])
        async with harness(fake) as (_, stub, _, _):
            err = await status_of(stub.Generate(REQ))
            assert err.code() == grpc.StatusCode.UNAVAILABLE
    run(body())


def test_deadline_cancels_upstream_promptly():
    async def body():
        fake = FakeTriton(script=lambda r: [response("a"), "hang"])
        async with harness(fake) as (gw, stub, _, _):
            t = time.monotonic()
            err = await status_of(stub.Generate(REQ, timeout=0.3))
            assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert time.monotonic() - t < 1.5
            await until(lambda: fake.cancelled == 1, what="the upstream stream cancelled")
            await until(lambda: gw.service.inflight == 0, what="the in-flight count back to 0")
    run(body())


def test_client_cancellation_cancels_upstream():
    async def body():
        fake = FakeTriton(script=lambda r: [response("a"), "hang"])
        async with harness(fake) as (gw, stub, _, _):
            call = stub.Generate(REQ)
            first = await call.read()
            assert first.text == "a"
            call.cancel()
            await until(lambda: fake.cancelled == 1, what="the upstream stream cancelled")
            await until(lambda: gw.service.inflight == 0, what="the in-flight count back to 0")
    run(body())


def test_in_flight_limit_is_resource_exhausted_and_recovers():
    async def body():
        fake = FakeTriton(script=lambda r: [response("a"), "hang"])
        async with harness(fake, max_inflight=2) as (gw, stub, _, _):
            calls = [stub.Generate(REQ) for _ in range(2)]
            for c in calls:
                await c.read()
            err = await status_of(stub.Generate(REQ))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "limit 2" in err.details()
            calls[0].cancel()
            await until(lambda: gw.service.inflight == 1, what="a slot freed")
            fake.script = lambda r: [response("ok", final=True)]
            out = await collect(stub.Generate(REQ))
            assert out[-1].text == "ok"
            calls[1].cancel()
    run(body())


# ---- readiness -------------------------------------------------------------------------------------------

def test_not_ready_is_unavailable_and_health_follows_readiness():
    async def body():
        fake = FakeTriton(ready=False)
        async with harness(fake) as (_, stub, health, _):
            for service in ("", "triton_llm.v1.LLMService"):
                assert (await health.Check(health_pb2.HealthCheckRequest(service=service))).status == NOT_SERVING
            err = await status_of(stub.Generate(REQ))
            assert err.code() == grpc.StatusCode.UNAVAILABLE
            assert fake.requests == []
            fake.ready = True

            async def serving():
                return (await health.Check(health_pb2.HealthCheckRequest())).status == SERVING
            await until(serving, what="health SERVING after the ensemble became ready")
            assert (await collect(stub.Generate(REQ)))[-1].usage.completion_tokens == 2
    run(body())


def test_triton_unreachable_is_unavailable_promptly():
    async def body():
        from cli.launcher import free_port

        async with harness(triton_url=f"127.0.0.1:{free_port()}") as (gw, stub, health, _):
            assert not gw.upstream.ready
            assert (await health.Check(health_pb2.HealthCheckRequest())).status == NOT_SERVING
            t = time.monotonic()
            err = await status_of(stub.Generate(REQ))
            assert err.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() - t < 1.0
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.GetModelInfo(pb.GetModelInfoRequest())
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    run(body())


def test_upstream_connection_lost_mid_stream_is_unavailable():
    async def body():
        fake = FakeTriton(script=lambda r: [response("a"), "hang"])
        fake_server, port = await start_fake(fake)
        gw = await gw_server.start(GatewayConfig(listen="127.0.0.1:0", triton_url=f"127.0.0.1:{port}",
                                                 health_interval_s=0.05))
        async with grpc.aio.insecure_channel(f"localhost:{gw.port}") as ch:
            call = pb_grpc.LLMServiceStub(ch).Generate(REQ)
            await call.read()
            t = time.monotonic()
            await fake_server.stop(0)  # Triton goes away with the request in flight
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call.read()
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() - t < 2.0
        await gw.stop(grace=0)
    run(body())


# ---- auth ------------------------------------------------------------------------------------------------

def test_auth(tmp_path):
    async def body():
        tokens = tmp_path / "tokens"
        tokens.write_text("# gateway tokens\nright-token\n")
        async with harness(auth_token_file=tokens) as (_, stub, health, fake):
            for md in [(), (("authorization", "Bearer wrong"),), (("authorization", "right-token"),),
                       (("authorization", "Basic right-token"),), (("authorization", "Bearer "),)]:
                for call in (stub.Generate(REQ, metadata=md),):
                    err = await status_of(call)
                    assert err.code() == grpc.StatusCode.UNAUTHENTICATED, md
                for unary in (stub.Tokenize(pb.TokenizeRequest(text="x"), metadata=md),
                              stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=md)):
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await unary
                    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert fake.requests == []
            out = await collect(stub.Generate(REQ, metadata=(("authorization", "Bearer right-token"),)))
            assert out[-1].finish_reason == pb.FINISH_REASON_LENGTH
            out = await collect(stub.Generate(REQ, metadata=(("authorization", "bearer right-token"),)))
            assert out  # the scheme is case-insensitive
            assert (await health.Check(health_pb2.HealthCheckRequest())).status == SERVING  # no token needed
    run(body())


# ---- TLS -------------------------------------------------------------------------------------------------

def self_signed(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl not available to make a test certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True)
    return key, cert


def test_tls(tmp_path):
    key, cert = self_signed(tmp_path)

    async def body():
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        async with harness(tls_cert=cert, tls_key=key, channel_creds=creds) as (gw, stub, health, _):
            out = await collect(stub.Generate(REQ))
            assert "".join(m.text for m in out) == "hello world"
            async with grpc.aio.insecure_channel(f"localhost:{gw.port}") as plain:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await pb_grpc.LLMServiceStub(plain).GetModelInfo(pb.GetModelInfoRequest(), timeout=3)
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    run(body())


# ---- shutdown ---------------------------------------------------------------------------------------------

def test_graceful_shutdown_lets_streams_finish_then_cancels_the_rest():
    async def body():
        fake = FakeTriton(script=lambda r: [response("a"), 0.3, response("b", finish="length", n_out=2, final=True)])
        fake_server, port = await start_fake(fake)
        cfg = GatewayConfig(listen="127.0.0.1:0", triton_url=f"127.0.0.1:{port}", health_interval_s=0.05)
        gw = await gw_server.start(cfg)
        async with grpc.aio.insecure_channel(f"localhost:{gw.port}") as ch:
            stub, health = pb_grpc.LLMServiceStub(ch), health_pb2_grpc.HealthStub(ch)
            call = stub.Generate(REQ)
            assert (await call.read()).text == "a"
            stopping = asyncio.ensure_future(gw.stop(grace=5.0))
            await asyncio.sleep(0.05)
            rest = await collect(call)  # finishes within the grace period
            assert rest[-1].text == "b" and rest[-1].finish_reason == pb.FINISH_REASON_LENGTH
            await stopping
        assert fake.cancelled == 0

        fake.script = lambda r: [response("a"), "hang"]
        gw = await gw_server.start(replace(cfg, listen="127.0.0.1:0"))
        async with grpc.aio.insecure_channel(f"localhost:{gw.port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            call = pb_grpc.LLMServiceStub(ch).Generate(REQ)
            await call.read()
            t = time.monotonic()
            stopping = asyncio.ensure_future(gw.stop(grace=0.3))
            await asyncio.sleep(0.05)
            err = await status_of(call)
            assert err.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
            await stopping
            assert time.monotonic() - t < 2.0
            await until(lambda: fake.cancelled == 1, what="the upstream stream cancelled at the end of the grace")
        await fake_server.stop(0)
    run(body())


def test_health_is_not_serving_once_shutdown_starts():
    async def body():
        fake = FakeTriton(script=lambda r: [response("a"), "hang"])
        async with harness(fake) as (gw, stub, health, _):
            call = stub.Generate(REQ)
            await call.read()
            stopping = asyncio.ensure_future(gw.stop(grace=1.0))
            await asyncio.sleep(0.05)
            assert gw.health._gracefully_shutting_down
            status = await gw.health.Check(health_pb2.HealthCheckRequest(), None)
            assert status.status == NOT_SERVING
            call.cancel()
            await stopping
    run(body())


# ---- reflection, model info, tokenize ---------------------------------------------------------------------

def test_reflection_lists_the_services_without_auth():
    async def body():
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

        async with harness(auth_tokens=("tok",)) as (gw, *_):
            async with grpc.aio.insecure_channel(f"localhost:{gw.port}") as ch:
                refl = reflection_pb2_grpc.ServerReflectionStub(ch)

                async def ask(**kw):
                    call = refl.ServerReflectionInfo()
                    await call.write(reflection_pb2.ServerReflectionRequest(**kw))
                    resp = await call.read()
                    await call.done_writing()
                    return resp

                names = [s.name for s in (await ask(list_services="")).list_services_response.service]
                assert "triton_llm.v1.LLMService" in names and "grpc.health.v1.Health" in names
                fd = await ask(file_containing_symbol="triton_llm.v1.LLMService")
                from google.protobuf import descriptor_pb2

                files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                         for b in fd.file_descriptor_response.file_descriptor_proto]
                svc = next(s for f in files for s in f.service if s.name == "LLMService")
                assert [m.name for m in svc.method] == ["Generate", "Tokenize", "GetModelInfo"]
    run(body())


def test_model_info_from_the_served_configs():
    async def body():
        fake = FakeTriton(llm_parameters={"model_path": "models/demo-target", "speculative_method": "ngram",
                                          "num_speculative_tokens": "3", "max_model_len": "512"},
                          preprocess_parameters={"tokenizer_path": "models/demo-target"},
                          script=lambda r: [error("in ensemble 'ensemble', guided_decoding_guide_type: "
                                                  "guided decoding is not supported yet by this engine")])
        async with harness(fake, model_root=REPO) as (_, stub, _, _):
            info = await stub.GetModelInfo(pb.GetModelInfoRequest())
            assert info.name == "demo-target" and info.triton_model == "ensemble"
            assert (info.vocab_size, info.max_context_tokens, info.architecture) == (4096, 512, "LlamaForCausalLM")
            assert info.speculative_method == pb.SPECULATIVE_METHOD_NGRAM and info.num_speculative_tokens == 3
            assert list(info.supported_guide_types) == []
            probes = len(fake.requests)
            await stub.GetModelInfo(pb.GetModelInfoRequest())
            assert len(fake.requests) == probes == 1  # the probe's answer is cached

        fake = FakeTriton(llm_parameters={"model_path": str(REPO / "models/demo-target")})
        async with harness(fake) as (_, stub, _, _):
            info = await stub.GetModelInfo(pb.GetModelInfoRequest())
            assert info.max_context_tokens == 1024 and info.speculative_method == pb.SPECULATIVE_METHOD_NONE
            assert len(info.supported_guide_types) == 5  # the fake accepted the guided probe
    run(body())


def test_tokenize_matches_preprocess():
    """Tokenize gives the ids preprocess's RequestParser computes for Generate's prompt or messages."""
    import json

    import numpy as np

    from preprocess import RequestParser, load_tokenizer

    parser = RequestParser(load_tokenizer(REPO / "models/demo-target"))

    def preprocess_ids(**inputs) -> list[int]:
        arrays = {k: np.asarray([[v.encode() if isinstance(v, str) else v]], dtype=np.object_ if isinstance(v, str)
                                else np.int32) for k, v in inputs.items()}
        return list(parser.parse(arrays).prompt_token_ids)

    async def body():
        fake = FakeTriton(preprocess_parameters={"tokenizer_path": str(REPO / "models/demo-target")},
                          llm_parameters={"model_path": str(REPO / "models/demo-target")})
        async with harness(fake) as (_, stub, _, _):
            text = "def fibonacci(n):\n    return n"
            r = await stub.Tokenize(pb.TokenizeRequest(text=text))
            assert list(r.token_ids) == preprocess_ids(text_input=text, max_tokens=1)
            assert r.token_count == len(r.token_ids) and r.prompt == text and r.max_context_tokens == 1024
            no_bos = await stub.Tokenize(pb.TokenizeRequest(text=text, add_special_tokens=False))
            assert list(no_bos.token_ids) == list(r.token_ids)[1:]
            msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "sort a list"}]
            r = await stub.Tokenize(pb.TokenizeRequest(messages=pb.ChatMessages(
                messages=[pb.ChatMessage(**m) for m in msgs])))
            assert list(r.token_ids) == preprocess_ids(messages=json.dumps(msgs), max_tokens=1)
            assert r.prompt.endswith("<|assistant|>\n")
            for req, field in [(pb.TokenizeRequest(), "text"),
                               (pb.TokenizeRequest(messages=pb.ChatMessages()), "messages"),
                               (pb.TokenizeRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(content="x")])),
                                "messages.messages[0].role"),
                               (pb.TokenizeRequest(text="x" * 1_000_001), "text")]:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.Tokenize(req)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and e.value.details().startswith(field + ":")
    run(body())


def test_tokenize_without_a_reachable_tokenizer_is_failed_precondition(tmp_path):
    async def body():
        fake = FakeTriton(preprocess_parameters={"tokenizer_path": str(tmp_path / "missing")})
        async with harness(fake) as (_, stub, _, _):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Tokenize(pb.TokenizeRequest(text="x"))
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "Traceback" not in e.value.details()
    run(body())
