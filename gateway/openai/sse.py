"""Server-sent events as OpenAI streams them: ``data: {json}`` per chunk, ``data: [DONE]`` at the end.

``respond(events)`` waits for the first event before answering, so an error the ensemble reports at
once (a bad field) is an ordinary HTTP error with its status; an error after the first byte is sent
as a ``data: {"error": ...}`` event and the stream closes. A client that disconnects makes the ASGI
server stop the stream; closing ``events`` then cancels the upstream request.
"""
from __future__ import annotations

import contextlib
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


async def respond(events: AsyncIterator[bytes], on_close=None) -> StreamingResponse:
    """A StreamingResponse of ``events`` (each already ``event()``-encoded), ``DONE`` after the last;
    raises the first event's ``APIError`` itself. ``on_close()`` runs once the stream is over."""
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
        try:
            async with contextlib.aclosing(events):
                if first:
                    yield first
                try:
                    async for chunk in events:
                        yield chunk
                except APIError as e:
                    yield event(e.body())
                    return
                yield DONE
        finally:
            if on_close is not None:
                on_close()

    return StreamingResponse(body(), media_type="text/event-stream", headers=HEADERS)
