"""Auth on every surface of the gateway (a fake Triton behind it): each gRPC method of each service the server
lists by reflection, and each HTTP route of the OpenAI app, refuses a missing or wrong bearer token, except the
open ones docs/api-grpc.md and docs/api-openai.md name (health, reflection, /health, /health/ready, /metrics,
/openapi.json); TLS with auth (the constant-time comparison of tokens: test_gateway_config.py).
The surfaces are enumerated from the server and the app, so a new method or route is checked without a new test.
"""
from __future__ import annotations

import ssl

import grpc
import httpx
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.gateway.fake_triton import harness, run
from tests.gateway.openai_harness import MODEL, served
from tests.gateway.test_gateway_service import self_signed

TOKENS = ("tok-one", "tok-two", "tok-three")
WRONG = [None, "Bearer wrong", "tok-one", "Basic tok-one", "Bearer", "Bearer tok-one-", "Bearer tok-on",
         "Bearer TOK-ONE"]
OPEN_SERVICES = {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}
OPEN_ROUTES = {"/health", "/health/ready", "/metrics", "/openapi.json"}


def auth(value: str | None) -> tuple:
    return () if value is None else (("authorization", value),)


async def listed_services(channel) -> list[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    async for r in stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])):
        return [s.name for s in r.list_services_response.service]
    return []


def methods(service: str):
    """(path, request class, server-streaming) of every method of ``service``."""
    desc = descriptor_pool.Default().FindServiceByName(service)
    for m in desc.methods:
        yield (f"/{service}/{m.name}", message_factory.GetMessageClass(m.input_type), m.server_streaming)


async def status(channel, path: str, request_cls, streaming: bool, metadata) -> grpc.StatusCode:
    kind = channel.unary_stream if streaming else channel.unary_unary
    call = kind(path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=lambda b: b)
    try:
        if streaming:
            async for _ in call(request_cls(), metadata=metadata, timeout=10):
                pass
        else:
            await call(request_cls(), metadata=metadata, timeout=10)
    except grpc.aio.AioRpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def test_every_grpc_method_but_health_and_reflection_needs_a_token():
    async def body():
        async with harness(auth_tokens=TOKENS) as (gw, _, _, fake):
            async with grpc.aio.insecure_channel(f"localhost:{gw.port}") as channel:
                services = await listed_services(channel)
                assert "triton_llm.v1.LLMService" in services and OPEN_SERVICES <= set(services)
                guarded = [m for s in services if s not in OPEN_SERVICES for m in methods(s)]
                assert {p.rsplit("/", 1)[1] for p, *_ in guarded} >= {"Generate", "Tokenize", "GetModelInfo"}
                for path, cls, streaming in guarded:
                    for value in WRONG:
                        code = await status(channel, path, cls, streaming, auth(value))
                        assert code == grpc.StatusCode.UNAUTHENTICATED, (path, value, code)
                    code = await status(channel, path, cls, streaming, auth(f"Bearer {TOKENS[1]}"))
                    assert code != grpc.StatusCode.UNAUTHENTICATED, path
                assert fake.requests == [] or all(r.id.startswith("gateway-guide-probe") for r in fake.requests)
                health = [m for m in methods("grpc.health.v1.Health") if not m[2]]
                assert [await status(channel, *m, ()) for m in health] == [grpc.StatusCode.OK]
    run(body())


def call_route(http: httpx.Client, method: str, path: str, token: str | None) -> httpx.Response:
    body = None
    if path.endswith("/chat/completions"):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    elif path.endswith("/completions"):
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    headers = {} if token is None else {"authorization": token}
    return http.request(method, path.replace("{model}", MODEL), json=body, headers=headers)


def test_every_http_route_but_the_documented_open_ones_needs_a_key():
    with served(auth_tokens=TOKENS) as s:
        app = s.gw.http.config.app
        routes = [(method, r.path) for r in app.routes for method in sorted(getattr(r, "methods", None) or ())
                  if method != "HEAD"]
        assert {p for _, p in routes} >= OPEN_ROUTES | {"/v1/chat/completions", "/v1/completions", "/v1/models"}
        with httpx.Client(base_url=s.base_url, timeout=30) as http:
            for method, path in routes:
                if path in OPEN_ROUTES:
                    assert call_route(http, method, path, None).status_code != 401, path
                    continue
                for value in WRONG:
                    r = call_route(http, method, path, value)
                    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, value)
                assert call_route(http, method, path, f"Bearer {TOKENS[2]}").status_code != 401, path


def test_no_undocumented_route_is_served():
    """FastAPI's /docs and /redoc (pages that load scripts from a CDN) are off: every route is in the table."""
    with served() as s:
        paths = {r.path for r in s.gw.http.config.app.routes}
        assert paths == OPEN_ROUTES | {"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/{model}"}
        assert httpx.get(s.base_url + "/docs").status_code == 404


def test_tls_with_auth_on_both_ports(tmp_path):
    key, cert = self_signed(tmp_path)
    with served(auth_tokens=TOKENS, tls_cert=cert, tls_key=key) as s:
        base = s.base_url.replace("http://127.0.0.1", "https://localhost")
        with httpx.Client(verify=ssl.create_default_context(cafile=str(cert)), timeout=30) as https:
            assert https.get(base + "/v1/models").status_code == 401
            ok = https.get(base + "/v1/models", headers={"authorization": f"Bearer {TOKENS[0]}"})
            assert ok.status_code == 200 and ok.json()["data"]
        with pytest.raises(httpx.HTTPError):
            httpx.get(s.base_url + "/v1/models", headers={"authorization": f"Bearer {TOKENS[0]}"}, timeout=5)

        async def grpc_calls():
            creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
            async with grpc.aio.secure_channel(f"localhost:{s.gw.port}", creds) as channel:
                path, cls, streaming = next(m for m in methods("triton_llm.v1.LLMService") if m[0].endswith("Tokenize"))
                assert await status(channel, path, cls, streaming, ()) == grpc.StatusCode.UNAUTHENTICATED
                assert await status(channel, path, cls, streaming, auth(f"Bearer {TOKENS[0]}")) != \
                    grpc.StatusCode.UNAUTHENTICATED
        s.call(grpc_calls())


def test_max_request_bytes_bounds_both_ports():
    """``--max-request-bytes``: an HTTP body over it is 413 naming the setting, a gRPC message over it
    RESOURCE_EXHAUSTED before the handler runs (nothing reaches Triton)."""
    with served(max_request_bytes=4096) as s:
        body = {"model": MODEL, "prompt": "x" * 5000, "max_tokens": 1}
        r = httpx.post(s.base_url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 413 and r.json()["error"]["param"] == "body"
        assert "(--max-request-bytes)" in r.json()["error"]["message"]
        assert httpx.post(s.base_url + "/v1/completions", json={**body, "prompt": "x"}, timeout=30).status_code == 200

        async def grpc_calls():
            from triton_llm.v1 import llm_service_pb2 as pb

            async with grpc.aio.insecure_channel(f"localhost:{s.gw.port}") as channel:
                path, cls, streaming = next(m for m in methods("triton_llm.v1.LLMService") if m[0].endswith("Tokenize"))
                call = channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                           response_deserializer=pb.TokenizeResponse.FromString)
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await call(pb.TokenizeRequest(text="x" * 5000), timeout=10)
                assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        n = len(s.fake.requests)
        s.call(grpc_calls())
        assert len(s.fake.requests) == n
