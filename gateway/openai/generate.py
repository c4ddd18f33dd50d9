"""One generation request's path, shared by ``POST /v1/chat/completions`` and ``POST /v1/completions``.

``generate`` admits the request (``admission.admit``), builds its Triton requests (the endpoint's own, each
under the LoRA adapter its ``model`` names), runs them (``Runner``) and answers as SSE (``stream: true``)
or whole; the admission slot is released however the response ends, and a non-streamed request whose client
disconnects is cancelled as a streamed one is. An ``Endpoint`` is what differs: the chat or the text form.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from dataclasses import dataclass, field
from typing import Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from gateway.service import LLMService
from triton_llm.v1 import llm_service_pb2 as pb

from . import guides, params, prompt
from .admission import Admitted, admit
from .chat import ChatCompletion
from .completions import Completion
from .errors import APIError, bad_request
from .logprobs import Splitter, token_strings
from .runner import Runner
from .schemas import ChatCompletionRequest, CompletionRequest
from .span import request_attributes
from .sse import respond

log = logging.getLogger("gateway")


class Endpoint(Protocol):
    """What the chat and the text completions differ in."""
    body: ChatCompletionRequest | CompletionRequest

    def param_of(self) -> dict[str, str]: ...                          # Runner's error fields to request params
    def wants_logprobs(self) -> bool: ...
    def requests(self, max_context_tokens: int) -> list[pb.GenerateRequest]: ...
    def output(self, runner: Runner, request_id: str, include_usage: bool,
               split: Splitter | None) -> ChatCompletion | Completion: ...


@dataclass
class ChatEndpoint:
    body: ChatCompletionRequest
    plan: guides.OutputPlan = field(init=False)

    def __post_init__(self) -> None:
        self.plan = guides.plan(self.body)      # a bad guide is a 400 before admission

    def param_of(self) -> dict[str, str]:
        return params.param_of(self.plan.param)

    def wants_logprobs(self) -> bool:
        return bool(self.body.logprobs)

    def requests(self, max_context_tokens: int) -> list[pb.GenerateRequest]:
        body = self.body
        return [params.chat_request(body, prompt.prompt_messages(body), max_context_tokens, self.plan.guide)]

    def output(self, runner: Runner, request_id: str, include_usage: bool, split: Splitter | None) -> ChatCompletion:
        body = self.body
        return ChatCompletion(runner, self.plan, model=body.model, completion_id="chatcmpl-" + request_id, n=body.n,
                              logprobs=body.logprobs, include_usage=include_usage, split=split)


@dataclass
class CompletionEndpoint:
    body: CompletionRequest
    prompts: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.prompts = self.body.prompts()

    def param_of(self) -> dict[str, str]:
        return params.PARAM_OF

    def wants_logprobs(self) -> bool:
        return self.body.logprobs is not None

    def requests(self, max_context_tokens: int) -> list[pb.GenerateRequest]:
        return [params.completion_request(self.body, p) for p in self.prompts]

    def output(self, runner: Runner, request_id: str, include_usage: bool, split: Splitter | None) -> Completion:
        body = self.body
        return Completion(runner, model=body.model, completion_id="cmpl-" + request_id, prompts=self.prompts,
                          n=body.n, echo=body.echo, logprobs=body.logprobs is not None, include_usage=include_usage,
                          split=split, top=bool(body.logprobs))


def refuse(body: ChatCompletionRequest | CompletionRequest) -> None:
    """400 for a setting the body asks for that is not implemented (``body.refused()``)."""
    refused = body.refused()
    if refused is not None:
        raise bad_request(*refused)


async def generate(service: LLMService, request: Request, endpoint: Endpoint) -> Response:
    """Admit, build, run; SSE or the whole body. The slot is released once the response is over."""
    admitted = await admit(service, request, endpoint.body.model)
    try:
        output = await _start(service, admitted, endpoint)
    except BaseException:
        admitted.release()
        raise
    if endpoint.body.stream:
        return await respond(output.chunks(), admitted.release)
    return await _whole(request, admitted, output.whole())


async def _start(service: LLMService, admitted: Admitted, endpoint: Endpoint) -> ChatCompletion | Completion:
    """The admitted request's Triton requests, on the span and in a ``Runner``; the endpoint's output over it."""
    body, upstream = endpoint.body, service.upstream
    if body.user:
        log.info("request %s: user %s", admitted.request_id, body.user)
    facts = await upstream.facts()
    reqs = endpoint.requests(facts.max_context_tokens)
    for req in reqs:
        params.select_adapter(req, body.model, facts.lora_adapters)
    request_attributes(admitted.span, reqs, admitted.request_id, body.model, upstream.model)
    runner = admitted.runner = Runner(upstream, service.closer, reqs, admitted.request_id, body.n,
                                      endpoint.param_of(), admitted.metadata, service.stream_buffer_bytes)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return endpoint.output(runner, admitted.request_id, include_usage and body.stream,
                           await splitter(service, endpoint.wants_logprobs()))


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


async def splitter(service: LLMService, wanted: bool) -> Splitter | None:
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
