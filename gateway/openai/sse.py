"""Server-sent events as OpenAI streams them: ``data: {json}`` per chunk, ``data: [DONE]`` at the end.

``respond(events)`` waits for the first event before answering, so an error the ensemble reports at
once (a bad field) is an ordinary HTTP error with its status; an error after the first byte is sent
as a ``data: {"error": ...}`` event and the stream closes. A client that disconnects makes the ASGI
server stop the stream; closing ``events`` then cancels the upstream request.
"""
from __future__ import annotations

import json
import logging
from typing import AsyncIterator

from fastapi.responses import StreamingResponse

from .errors import APIError

log = logging.getLogger("gateway")

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class EventStream(StreamingResponse):
    """A StreamingResponse that closes its events and runs ``on_close`` however the response ends (also
    when the client is gone before the body starts, so the body's own ``finally`` would never run)."""

    def __init__(self, body, events: AsyncIterator[bytes], on_close) -> None:
        super().__init__(body, media_type="text/event-stream", headers=HEADERS)
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._events.aclose()
            if self._on_close is not None:
                self._on_close()


async def respond(events: AsyncIterator[bytes], on_close=None) -> StreamingResponse:
    """An ``EventStream`` of ``events`` (each already ``event()``-encoded), ``DONE`` after the last;
    raises the first event's ``APIError`` itself. ``on_close()`` (idempotent) runs once the stream is over."""
    try:
        first = await events.__anext__()
    except StopAsyncIteration:
        first = b""
    except BaseException:
        await events.aclose()
        if on_close is not None:
            on_close()
        raise

    async def body() -> AsyncIterator[bytes]:
        if first:
            yield first
        try:
            async for chunk in events:
                yield chunk
        except APIError as e:
            yield event(e.body())
            return
        yield DONE

    return EventStream(body(), events, on_close)
