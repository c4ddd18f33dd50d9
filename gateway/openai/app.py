"""The OpenAI-compatible HTTP API as a FastAPI app, beside the gRPC service and sharing its state.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (streamed as SSE or not),
``GET /v1/models`` (and ``/v1/models/{model}``), ``GET /health`` (the process is up),
``GET /health/ready`` (Triton's ensemble is ready: 200, else 503), ``GET /metrics`` (Triton's
Prometheus metrics, fetched from ``metrics_url``, so a router that scrapes the pool's target port
reads the engine's gauges) and FastAPI's ``/openapi.json``. Both generation routes take one path
(generate.py). Routes are module-level functions over the app's state (``service``, ``metrics_url``, ``http``).
Bodies over ``max_body_bytes`` (``--max-request-bytes``, the gRPC port's message limit too) get 413.
"""
from __future__ import annotations

from typing import Annotated

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response

from gateway.service import LLMService

from .admission import check_auth, served_names
from .errors import APIError, install
from .generate import ChatEndpoint, CompletionEndpoint, generate, refuse
from .schemas import ChatCompletionRequest, CompletionRequest, ErrorResponse
from .span import ServerSpans

MAX_BODY_BYTES = 16 * 2**20
METRICS_TIMEOUT_S = 5.0


class BodyLimit:
    """ASGI middleware: 413 for a request body over ``limit`` bytes (declared or streamed)."""

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def too_large(self, scope, receive, send):
        return await APIError(413, f"body: request body over {self.limit} bytes (--max-request-bytes)",
                              param="body", code="request_too_large").response()(scope, receive, send)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self.too_large(scope, receive, send)
        if declared is not None:
            return await self.app(scope, receive, send)
        # A body without a declared length (chunked): read it here, up to the limit, then replay it.
        messages, seen = [], 0
        while True:
            message = await receive()
            messages.append(message)
            seen += len(message.get("body", b""))
            if seen > self.limit:
                return await self.too_large(scope, receive, send)
            if message["type"] != "http.request" or not message.get("more_body"):
                break

        async def replay():
            return messages.pop(0) if messages else await receive()
        return await self.app(scope, replay, send)


def _errors(*statuses: int) -> dict:
    return {status: {"model": ErrorResponse} for status in statuses}


GENERATION_ERRORS = _errors(400, 401, 404, 413, 429, 503)
SSE = {200: {"content": {"application/json": {}, "text/event-stream": {}},
             "description": "the completion, or with stream: true its chunks as server-sent events"}}


def _without_422(app: FastAPI):
    """FastAPI's schema, less the 422 it documents for every body: validation errors are 400 here."""
    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = FastAPI.openapi(app)
            for path in schema.get("paths", {}).values():
                for op in path.values():
                    op.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema
    return openapi


def service_of(request: Request) -> LLMService:
    return request.app.state.service


Service = Annotated[LLMService, Depends(service_of)]


async def authorized(request: Request, service: Service) -> None:
    """A dependency, so that a missing key is a 401 before the body is validated (as OpenAI answers)."""
    check_auth(service, request)


async def chat_completions(body: ChatCompletionRequest, request: Request, service: Service):
    refuse(body)
    return await generate(service, request, ChatEndpoint(body))


async def completions(body: CompletionRequest, request: Request, service: Service):
    refuse(body)
    return await generate(service, request, CompletionEndpoint(body))


def model_object(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "triton-llm"}


async def models(service: Service):
    return {"object": "list", "data": [model_object(n) for n in await served_names(service)]}


async def model(model: str, service: Service):
    if model not in await served_names(service):
        raise APIError(404, f"The model {model!r} does not exist", param="model", code="model_not_found")
    return model_object(model)


async def health():
    return {"status": "ok"}


async def ready(service: Service):
    upstream = service.upstream
    if upstream.ready:
        return {"status": "ready"}
    return APIError(503, f"Triton's {upstream.model!r} model is not ready", code="model_not_ready",
                    headers={"Retry-After": "1"}).response()


async def metrics(request: Request):     # Triton's Prometheus metrics, fetched from metrics_url
    state = request.app.state
    try:
        r = await state.http.get(state.metrics_url)
    except httpx.HTTPError as e:
        raise APIError(503, f"Triton's metrics at {state.metrics_url} are unavailable: {type(e).__name__}",
                       code="metrics_unavailable") from None
    return Response(r.content, status_code=r.status_code,
                    media_type=r.headers.get("content-type", "text/plain; version=0.0.4"))


def create_app(service: LLMService, metrics_url: str, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    # no /docs or /redoc: undocumented pages, open without a token, that load their scripts from a CDN
    app = FastAPI(title="triton-llm: OpenAI-compatible API", version="1.0", docs_url=None, redoc_url=None,
                  description="Chat and text completions on Triton's ensemble (docs/api-openai.md).")
    install(app)
    app.openapi = _without_422(app)
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    if service.tracing is not None:     # added last: the outermost, so a refused body has its span too
        app.add_middleware(ServerSpans, tracing=service.tracing)
    app.state.service, app.state.metrics_url = service, metrics_url
    app.state.http = httpx.AsyncClient(timeout=METRICS_TIMEOUT_S)
    app.router.on_shutdown.append(app.state.http.aclose)
    guarded = [Depends(authorized)]
    generation = {"methods": ["POST"], "dependencies": guarded, "responses": {**SSE, **GENERATION_ERRORS}}
    app.add_api_route("/v1/chat/completions", chat_completions, **generation)
    app.add_api_route("/v1/completions", completions, **generation)
    app.add_api_route("/v1/models", models, dependencies=guarded, responses=_errors(401, 503))
    app.add_api_route("/v1/models/{model}", model, dependencies=guarded, responses=_errors(401, 404, 503))
    app.add_api_route("/health", health)
    app.add_api_route("/health/ready", ready, responses=_errors(503))
    app.add_api_route("/metrics", metrics, responses=_errors(503), response_class=Response)
    return app
