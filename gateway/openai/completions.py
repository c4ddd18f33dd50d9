"""``POST /v1/completions``: OpenAI's text completion objects and chunks from a ``Runner``'s pieces.

A list of prompts gives ``len(prompt) * n`` choices (``Runner``'s numbering). ``echo`` puts the
prompt before the completion (in the first chunk when streamed). ``logprobs: 0`` gives each returned
token's logprob (``tokens``, ``token_logprobs``, ``text_offset``; ``top_logprobs`` null), ``logprobs: k``
adds each token's ``k`` most likely alternatives (``top_logprobs``: a ``{token: logprob}`` map per token);
the token strings as logprobs.py finds them.
"""
from __future__ import annotations

import time
from typing import AsyncIterator

from .logprobs import Splitter, logprob_entries
from .runner import Runner
from .sse import event


class Completion:
    def __init__(self, runner: Runner, *, model: str, completion_id: str, prompts: list[str], n: int, echo: bool,
                 logprobs: bool, include_usage: bool, split: Splitter | None = None, top: bool = False) -> None:
        self.runner = runner
        self.model = model
        self.id = completion_id
        self.created = int(time.time())
        self.prompts = prompts
        self.n = n
        self.echo = echo
        self.logprobs = logprobs
        self.top = top
        self.include_usage = include_usage
        self.split = split

    def _lp_block(self, entries: list[dict], offset: int) -> dict:
        offsets, pos = [], offset
        for e in entries:
            offsets.append(pos)
            pos += len(e["token"])
        top = [{a["token"]: a["logprob"] for a in e["top_logprobs"]} for e in entries] if self.top else None
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": top, "text_offset": offsets}

    def _chunk(self, choice: dict) -> bytes:
        chunk = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                 "system_fingerprint": None, "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None
        return event(chunk)

    def _prefix(self, index: int) -> str:
        return self.prompts[index // self.n] if self.echo else ""

    async def chunks(self) -> AsyncIterator[bytes]:
        started: set[int] = set()
        offsets = [0] * (len(self.prompts) * self.n)
        async for p in self.runner.pieces():
            text = p.text
            if p.index not in started:
                started.add(p.index)
                text = self._prefix(p.index) + text
            lps = None
            if self.logprobs:
                start = offsets[p.index] + len(text) - len(p.text)
                lps = self._lp_block(logprob_entries(p.text, p.logprobs, self.split, p.top), start)
            offsets[p.index] += len(text)
            if text or lps or p.finish:
                yield self._chunk({"index": p.index, "text": text, "logprobs": lps, "finish_reason": p.finish})
        if self.include_usage:
            yield event({"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                         "system_fingerprint": None, "choices": [], "usage": self.runner.usage().body()})

    async def whole(self) -> dict:
        count = len(self.prompts) * self.n
        texts = [self._prefix(i) for i in range(count)]
        entries: list[list[dict]] = [[] for _ in range(count)]
        finish = ["stop"] * count
        async for p in self.runner.pieces():
            texts[p.index] += p.text
            entries[p.index] += logprob_entries(p.text, p.logprobs, self.split, p.top)
            if p.finish is not None:
                finish[p.index] = p.finish
        choices = [{"index": i, "text": texts[i],
                    "logprobs": self._lp_block(entries[i], len(self._prefix(i))) if self.logprobs else None,
                    "finish_reason": finish[i]} for i in range(count)]
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, "usage": self.runner.usage().body()}
