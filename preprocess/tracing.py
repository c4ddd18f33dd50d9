"""Preprocess spans: one ``preprocess`` span per traced request, with its chat-template rendering and
tokenization as child spans, under Triton's ``preprocess`` span.

Only built when tracing is on (``PreprocessServing`` holds a ``PreprocessTracing`` then, else None).
The stages are timed by wrapping the parser's tokenizer and chat template in thin proxies, so the
parser itself knows nothing about tracing.
"""
from __future__ import annotations

import time
from typing import Any

import tracing as t
from contracts import wire
from tracing import ModelTracer, request_trace_context


class _Timed:
    """Delegates to ``target``; the named method's calls are appended to ``log`` as (stage, start_ns, end_ns)."""

    def __init__(self, target: Any, method: str, stage: str, log: list):
        self._target, self._method, self._stage, self._log = target, method, stage, log

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name != self._method:
            return attr

        def timed(*args, **kwargs):
            start = time.time_ns()
            try:
                return attr(*args, **kwargs)
            finally:
                self._log.append((self._stage, start, time.time_ns()))
        return timed


class PreprocessTracing:
    def __init__(self, tracer: ModelTracer, parser):
        self.tracer = tracer
        self.stages: list[tuple[str, int, int]] = []   # the current request's (stage, start, end)
        parser.tokenizer = _Timed(parser.tokenizer, "encode", "preprocess.tokenize", self.stages)
        if getattr(parser, "chat_template", None) is not None:
            parser.chat_template = _Timed(parser.chat_template, "render", "preprocess.chat_template", self.stages)

    def before(self, request) -> tuple[Any, int]:
        """(parent context or None, start time); call before parsing."""
        self.stages.clear()
        return self.tracer.parent(request_trace_context(request)), time.time_ns()

    def after(self, token: tuple[Any, int], response) -> None:
        """Record the request's spans from the response preprocess built (nothing when untraced)."""
        parent, start_ns = token
        if parent is None:
            return
        error = response.error().message() if response.has_error() else None
        outputs = {} if error else {x.name(): x.as_numpy() for x in response.output_tensors()}
        ids, stop = outputs.get(wire.INPUT_IDS), outputs.get(wire.STOP)
        ctx = self.tracer.span("preprocess", parent, start_ns, time.time_ns(), {
            t.GEN_AI_USAGE_INPUT_TOKENS: int(ids.size) if ids is not None and ids.size else None,
            t.ATTR_PREFIX + "chat": any(stage == "preprocess.chat_template" for stage, _, _ in self.stages),
            t.ATTR_PREFIX + "stop_request": bool(stop is not None and stop.any()) or None,
        }, error=error)
        for stage, s, e in self.stages:
            self.tracer.span(stage, ctx, s, e)
