"""``POST /v1/chat/completions``: OpenAI's chat completion objects and chunks from a ``Runner``'s pieces.

Streamed: each choice's first chunk carries ``role: assistant``; content and tool-call deltas carry
the choice's ``index``; the last chunk of a choice has its ``finish_reason``; with
``stream_options.include_usage`` every chunk has ``usage: null`` and a last chunk with ``choices: []``
and the usage comes before ``data: [DONE]``. ``logprobs`` gives each returned token's logprob and
``top_logprobs`` its most likely alternatives (logprobs.py: how the token texts are found).
"""
from __future__ import annotations

import time
from typing import AsyncIterator

from .guides import OutputPlan
from .logprobs import Splitter, logprob_entries
from .runner import Runner
from .sse import event
from .tool_calls import ChoiceReader


class ChatCompletion:
    def __init__(self, runner: Runner, plan: OutputPlan, *, model: str, completion_id: str, n: int,
                 logprobs: bool, include_usage: bool, split: Splitter | None = None) -> None:
        self.runner = runner
        self.plan = plan
        self.model = model
        self.id = completion_id
        self.created = int(time.time())
        self.n = n
        self.logprobs = logprobs
        self.include_usage = include_usage
        self.split = split

    def _chunk(self, choices: list[dict]) -> bytes:
        chunk = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                 "system_fingerprint": None, "choices": choices}
        if self.include_usage:
            chunk["usage"] = None
        return event(chunk)

    def _choice(self, index: int, delta: dict, logprobs: list[dict] | None = None, finish: str | None = None) -> dict:
        return {"index": index, "delta": delta, "logprobs": {"content": logprobs} if logprobs else None,
                "finish_reason": finish}

    async def chunks(self) -> AsyncIterator[bytes]:
        readers = [ChoiceReader(self.plan) for _ in range(self.n)]
        started = False
        async for piece in self.runner.pieces():
            if not started:     # the role first, for every choice, once the ensemble has accepted the request
                started = True
                for i in range(self.n):
                    yield self._chunk([self._choice(i, {"role": "assistant", "content": ""})])
            reader = readers[piece.index]
            lps = logprob_entries(piece.text, piece.logprobs, self.split, piece.top) if self.logprobs else None
            deltas = reader.feed(piece.text)
            if piece.finish is not None:
                deltas += reader.finish()
            for k, delta in enumerate(deltas):
                yield self._chunk([self._choice(piece.index, delta, lps if k == 0 else None)])
            if lps and not deltas:
                yield self._chunk([self._choice(piece.index, {}, lps)])
            if piece.finish is not None:
                yield self._chunk([self._choice(piece.index, {}, None, reader.finish_reason(piece.finish))])
        if self.include_usage:
            usage = self.runner.usage().body()
            yield event({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                         "model": self.model, "system_fingerprint": None, "choices": [], "usage": usage})

    async def whole(self) -> dict:
        readers = [ChoiceReader(self.plan) for _ in range(self.n)]
        finish = ["stop"] * self.n
        lps: list[list[dict]] = [[] for _ in range(self.n)]
        async for piece in self.runner.pieces():
            readers[piece.index].feed(piece.text)
            lps[piece.index] += logprob_entries(piece.text, piece.logprobs, self.split, piece.top)
            if piece.finish is not None:
                finish[piece.index] = piece.finish
        choices = []
        for i, reader in enumerate(readers):
            message = reader.message()
            choices.append({"index": i, "message": message,
                            "logprobs": {"content": lps[i]} if self.logprobs else None,
                            "finish_reason": reader.finish_reason(finish[i])})
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, "usage": self.runner.usage().body()}
