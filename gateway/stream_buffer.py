"""What one stream's client has not taken yet: the deltas the gateway read from Triton, coalesced, bounded.

The gateway reads Triton's responses as fast as they come, whatever the client's pace, so that a slow
client never holds up the engine (nor makes tritonserver queue its responses without bound). Consecutive
deltas of one sequence wait here as one response (their texts, log-probs, token ids and top-logprob
alternatives joined when the client takes it), and the bytes they hold (``coalesced_bytes``: text, 4 per
log-prob, 8 per token id, the encoded size of each position's alternatives, plus ``RESPONSE_OVERHEAD`` per
waiting response) stay at most ``cap_bytes``: the delta that would pass the cap is refused, and the stream ends
with RESOURCE_EXHAUSTED (gateway/generation.py).
"""
from __future__ import annotations

import asyncio
from collections import deque

from triton_llm.v1 import llm_service_pb2 as pb

DEFAULT_CAP_BYTES = 1 << 20       # per stream; with --max-inflight 256 at most 256 MiB in all
RESPONSE_OVERHEAD = 64            # bytes counted per waiting response (ids, counts, framing)


def coalesced_bytes(resp: pb.GenerateResponse) -> int:
    """The bytes a delta adds to a waiting response."""
    return (len(resp.text.encode("utf-8")) + 4 * len(resp.log_probs) + 8 * len(resp.token_ids) +
            sum(alternatives.ByteSize() for alternatives in resp.top_log_probs))


def mergeable(last: pb.GenerateResponse, nxt: pb.GenerateResponse) -> bool:
    """``nxt`` may join ``last``: the same sequence, and ``last`` is not its end nor the request's."""
    return (last.sequence_index == nxt.sequence_index and last.finish_reason == pb.FINISH_REASON_UNSPECIFIED
            and not last.HasField("usage"))


def merge(parts: list[pb.GenerateResponse]) -> pb.GenerateResponse:
    """One response for consecutive deltas of a sequence: texts, log-probs and token ids joined; the counts,
    finish reason and usage of the last."""
    if len(parts) == 1:
        return parts[0]
    out = pb.GenerateResponse()
    texts = []
    for p in parts:
        texts.append(p.text)
        p.text = ""
        out.MergeFrom(p)      # repeated fields append; set scalars and messages: the later one wins
    out.text = "".join(texts)
    return out


class StreamBuffer:
    """A single-producer, single-consumer queue of coalesced responses with a byte cap."""

    def __init__(self, cap_bytes: int = DEFAULT_CAP_BYTES) -> None:
        if cap_bytes < 1:
            raise ValueError(f"stream_buffer_bytes: must be >= 1, got {cap_bytes}")
        self.cap_bytes = cap_bytes
        self.bytes = 0
        self.peak_bytes = 0
        self._groups: deque[list[pb.GenerateResponse]] = deque()
        self._closed = False
        self._error: BaseException | None = None
        self._ready = asyncio.Event()

    def push(self, resp: pb.GenerateResponse) -> bool:
        """Add a delta (joined to the last waiting response when it can be); False, adding nothing, when it
        would take the buffer past its cap."""
        size = coalesced_bytes(resp)
        join = bool(self._groups) and mergeable(self._groups[-1][-1], resp)
        added = size if join else size + RESPONSE_OVERHEAD
        if self.bytes + added > self.cap_bytes:
            return False
        if join:
            self._groups[-1].append(resp)
        else:
            self._groups.append([resp])
        self.bytes += added
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        self._ready.set()
        return True

    def close(self) -> None:
        """The producer is done: the consumer gets what waits, then the end."""
        self._closed = True
        self._ready.set()

    def fail(self, error: BaseException) -> None:
        """End the stream with ``error``: what waits is dropped, the consumer's next ``get`` raises it."""
        self._error = error
        self._groups.clear()
        self.bytes = 0
        self._ready.set()

    async def get(self) -> pb.GenerateResponse | None:
        """The next (coalesced) response, None at the end; raises the producer's error."""
        while True:
            if self._error is not None:
                raise self._error
            if self._groups:
                group = self._groups.popleft()
                self.bytes -= sum(coalesced_bytes(r) for r in group) + RESPONSE_OVERHEAD
                if not self._groups:
                    self._ready.clear()
                return merge(group)
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
