"""The upstream work of one HTTP request: one ``Generation`` per prompt, merged into numbered choices.

A completions request with a list of prompts runs them concurrently; choice ``i * n + k`` is sample
``k`` of prompt ``i``. ``pieces()`` yields ``Piece``s in arrival order and raises ``APIError`` (the
upstream's status as HTTP, the field renamed to the OpenAI parameter); closing it early (a client
that went away) cancels every upstream stream, so the engine frees the requests' KV blocks.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import AsyncIterator

from triton_llm.v1 import llm_service_pb2 as pb

from gateway.generation import Generation, StreamCloser
from gateway.mapping import UpstreamError
from gateway.upstream import TritonUpstream

from .errors import APIError, from_upstream

FINISH = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length", pb.FINISH_REASON_ABORT: "stop"}
_DONE = object()


@dataclass
class Piece:
    index: int                     # the choice
    text: str
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None      # set on the sequence's last piece: stop | length
    top: list[list[tuple[str, float]]] = field(default_factory=list)   # per token: (text, logprob), best first


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    def body(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


class Runner:
    def __init__(self, upstream: TritonUpstream, closer: StreamCloser, requests: list[pb.GenerateRequest],
                 request_id: str, n: int, param_of: dict[str, str],
                 metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.n = n
        self.param_of = param_of
        self.metadata = metadata
        ids = [request_id] if len(requests) == 1 else [f"{request_id}-{i}" for i in range(len(requests))]
        self.generations = [Generation(upstream, r, rid, closer) for r, rid in zip(requests, ids)]

    def usage(self) -> Usage:
        totals = [g.assembler.usage() for g in self.generations]
        return Usage(sum(u.prompt_tokens for u in totals), sum(u.completion_tokens for u in totals))

    def _piece(self, prompt: int, resp: pb.GenerateResponse) -> Piece:
        finish = FINISH.get(resp.finish_reason)
        top = [[(c.token, c.log_prob) for c in t.candidates] for t in resp.top_log_probs]
        return Piece(prompt * self.n + resp.sequence_index, resp.text, list(resp.log_probs), finish, top)

    async def pieces(self) -> AsyncIterator[Piece]:
        if len(self.generations) == 1:
            async with contextlib.aclosing(self.generations[0].responses(self.metadata)) as responses:
                try:
                    async for resp in responses:
                        yield self._piece(0, resp)
                except UpstreamError as e:
                    raise from_upstream(e, self.param_of) from None
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, g: Generation) -> None:
            try:
                async with contextlib.aclosing(g.responses(self.metadata)) as responses:
                    async for resp in responses:
                        await queue.put(self._piece(i, resp))
            except UpstreamError as e:
                await queue.put(from_upstream(e, self.param_of))
            finally:
                await queue.put(_DONE)

        tasks = [asyncio.get_running_loop().create_task(pump(i, g)) for i, g in enumerate(self.generations)]
        try:
            running = len(tasks)
            while running:
                item = await queue.get()
                if item is _DONE:
                    running -= 1
                elif isinstance(item, APIError):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
