"""The OpenAI-compatible HTTP API as a FastAPI app, beside the gRPC service and sharing its state.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (streamed as SSE or not),
``GET /v1/models`` (and ``/v1/models/{model}``), ``GET /health`` (the process is up),
``GET /health/ready`` (Triton's ensemble is ready: 200, else 503), ``GET /metrics`` (Triton's
Prometheus metrics, fetched from ``metrics_url``, so a router that scrapes the pool's target port
reads the engine's gauges) and FastAPI's ``/openapi.json``. Every generation passes ``admission.admit``; a non-streamed request whose
client disconnects is cancelled as a streamed one is. Bodies over ``max_body_bytes`` (``--max-request-bytes``,
the gRPC port's message limit too) get 413.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from gateway.service import LLMService

from . import guides, params, prompt
from .admission import Admitted, admit, check_auth, served_names
from .chat import ChatCompletion
from .completions import Completion
from .errors import APIError, bad_request, install
from .logprobs import Splitter, token_strings
from .runner import Runner
from .schemas import ChatCompletionRequest, CompletionRequest, ErrorResponse
from .span import ServerSpans, request_attributes
from .sse import respond

log = logging.getLogger("gateway")

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


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _whole(request: Request, admitted: Admitted, work) -> JSONResponse:
    """Run ``work`` (a coroutine giving the body); cancel it if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            log.info("request %s: the client disconnected; cancelled", admitted.request_id)
            with contextlib.suppress(asyncio.CancelledError, APIError):
                await task
            return JSONResponse({}, status_code=499)
        return JSONResponse(task.result())
    finally:
        watch.cancel()
        admitted.release()


def _refuse(body) -> None:
    refused = body.refused()
    if refused is not None:
        raise bad_request(*refused)


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


async def _splitter(service: LLMService, wanted: bool) -> Splitter | None:
    """The token-text splitter of logprobs.py, with the served model's tokenizer (when logprobs are asked)."""
    if not wanted:
        return None
    path = (await service.upstream.facts()).tokenizer_path
    try:
        tok = await asyncio.to_thread(service.tokenizer, path) if path is not None else None
    except Exception as e:      # TokenizerError names the file: logprobs without token texts then
        log.warning("logprobs: cannot load the tokenizer at %s: %s", path, e)
        tok = None
    return functools.partial(token_strings, tok)


def create_app(service: LLMService, metrics_url: str, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    # no /docs or /redoc: undocumented pages, open without a token, that load their scripts from a CDN
    app = FastAPI(title="triton-llm: OpenAI-compatible API", version="1.0", docs_url=None, redoc_url=None,
                  description="Chat and text completions on Triton's ensemble (docs/api-openai.md).")
    install(app)
    app.openapi = _without_422(app)
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    if service.tracing is not None:     # added last: the outermost, so a refused body has its span too
        app.add_middleware(ServerSpans, tracing=service.tracing)
    upstream = service.upstream
    http = httpx.AsyncClient(timeout=METRICS_TIMEOUT_S)
    app.router.on_shutdown.append(http.aclose)

    async def authorized(request: Request) -> None:
        """A dependency, so that a missing key is a 401 before the body is validated (as OpenAI answers)."""
        check_auth(service, request)
    guarded = [Depends(authorized)]

    @app.post("/v1/chat/completions", dependencies=guarded, responses={**SSE, **GENERATION_ERRORS})
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        _refuse(body)
        plan = guides.plan(body)
        admitted = await admit(service, request, body.model)
        try:
            if body.user:
                log.info("request %s: user %s", admitted.request_id, body.user)
            facts = await upstream.facts()
            req = params.chat_request(body, prompt.prompt_messages(body), facts.max_context_tokens, plan.guide)
            params.select_adapter(req, body.model, facts.lora_adapters)
            request_attributes(admitted.span, [req], admitted.request_id, body.model, upstream.model)
            runner = admitted.runner = Runner(upstream, service.closer, [req], admitted.request_id, body.n,
                                              params.param_of(plan.param), admitted.metadata,
                                              service.stream_buffer_bytes)
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            chat = ChatCompletion(runner, plan, model=body.model, completion_id="chatcmpl-" + admitted.request_id,
                                  n=body.n, logprobs=body.logprobs, include_usage=include_usage and body.stream,
                                  split=await _splitter(service, body.logprobs))
        except BaseException:
            admitted.release()
            raise
        if body.stream:
            return await respond(chat.chunks(), admitted.release)
        return await _whole(request, admitted, chat.whole())

    @app.post("/v1/completions", dependencies=guarded, responses={**SSE, **GENERATION_ERRORS})
    async def completions(body: CompletionRequest, request: Request):
        _refuse(body)
        admitted = await admit(service, request, body.model)
        try:
            if body.user:
                log.info("request %s: user %s", admitted.request_id, body.user)
            prompts = body.prompts()
            facts = await upstream.facts()
            reqs = [params.completion_request(body, p) for p in prompts]
            for req in reqs:
                params.select_adapter(req, body.model, facts.lora_adapters)
            request_attributes(admitted.span, reqs, admitted.request_id, body.model, upstream.model)
            runner = admitted.runner = Runner(upstream, service.closer, reqs, admitted.request_id, body.n,
                                              params.PARAM_OF, admitted.metadata, service.stream_buffer_bytes)
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            completion = Completion(runner, model=body.model, completion_id="cmpl-" + admitted.request_id,
                                    prompts=prompts, n=body.n, echo=body.echo, logprobs=body.logprobs is not None,
                                    include_usage=include_usage and body.stream,
                                    split=await _splitter(service, body.logprobs is not None),
                                    top=bool(body.logprobs))
        except BaseException:
            admitted.release()
            raise
        if body.stream:
            return await respond(completion.chunks(), admitted.release)
        return await _whole(request, admitted, completion.whole())

    def model_object(name: str) -> dict:
        return {"id": name, "object": "model", "created": 0, "owned_by": "triton-llm"}

    @app.get("/v1/models", dependencies=guarded, responses=_errors(401, 503))
    async def models():
        return {"object": "list", "data": [model_object(n) for n in await served_names(service)]}

    @app.get("/v1/models/{model}", dependencies=guarded, responses=_errors(401, 404, 503))
    async def model(model: str):
        if model not in await served_names(service):
            raise APIError(404, f"The model {model!r} does not exist", param="model", code="model_not_found")
        return model_object(model)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/health/ready", responses=_errors(503))
    async def ready():
        if upstream.ready:
            return {"status": "ready"}
        return APIError(503, f"Triton's {upstream.model!r} model is not ready", code="model_not_ready",
                        headers={"Retry-After": "1"}).response()

    @app.get("/metrics", responses=_errors(503), response_class=Response)
    async def metrics():
        try:
            r = await http.get(metrics_url)
        except httpx.HTTPError as e:
            raise APIError(503, f"Triton's metrics at {metrics_url} are unavailable: {type(e).__name__}",
                           code="metrics_unavailable") from None
        return Response(r.content, status_code=r.status_code,
                        media_type=r.headers.get("content-type", "text/plain; version=0.0.4"))

    return app
