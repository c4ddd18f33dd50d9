"""Postprocess spans: one ``postprocess`` span per traced request (detokenization and stop matching
over all of its streamed responses), not one per response.

The span starts when the request's first llm response is processed and ends when its final one
is; its parent is Triton's ``postprocess`` span of that first response (like ``llm.generate``, it
outlives that parent, and lies within the ensemble's span). Events: ``stop_string_matched`` and
``engine_stop_sent`` (the BLS stop, with its reason and duration). ``triton_llm.busy_seconds`` is
the time actually spent in postprocess, as the span mostly covers waiting for tokens.

Only built when tracing is on (``PostprocessServing`` holds a ``PostprocessTracing`` then, else None).
Per response it costs two clock reads and a table lookup; Triton's span context is read once per
request, and the response's tensors only on the final one.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import tracing as t
from tracing import ModelTracer, request_trace_context


@dataclass
class _Open:
    parent: Any
    start_ns: int
    responses: int = 0
    busy_ns: int = 0
    events: list = field(default_factory=list)


class PostprocessTracing:
    """``before``/``after`` around ``PostprocessServing._process`` (``tracing.TracedServing.process``);
    the response's meta comes from ``serving.last_meta``, parsed there."""

    def __init__(self, tracer: ModelTracer, serving, max_requests: int = 4096):
        self.tracer = tracer
        self.serving = serving
        self.max_requests = max_requests
        self._open: OrderedDict[str, _Open | None] = OrderedDict()   # None: seen, not traced
        self._stops: dict[str, list] = {}        # engine id -> events of a stop sent before its first after()

    def before(self, request) -> tuple[Any, int]:
        return request, time.time_ns()

    def engine_stop_sent(self, engine_id: str, reason: str, start_ns: int) -> None:
        now = time.time_ns()
        events = [("engine_stop_sent", now, {t.ATTR_PREFIX + "stop_reason": reason,
                                             t.ATTR_PREFIX + "bls_seconds": (now - start_ns) / 1e9})]
        if reason == "stop_string":   # the match is what made postprocess send the stop, just before
            events.insert(0, ("stop_string_matched", start_ns, {}))
        entry = self._open.get(engine_id)
        if entry is not None:
            entry.events += events
        elif engine_id not in self._open:
            self._stops[engine_id] = events

    def after(self, token: tuple[Any, int], response) -> None:
        request, start_ns = token
        meta = self.serving.last_meta
        if meta is None or meta.stop_ack:
            return
        rid = meta.request_id
        now = time.time_ns()
        if rid not in self._open:                # the request's first response
            parent = self.tracer.parent(request_trace_context(request))
            self._open[rid] = _Open(parent, start_ns) if parent is not None else None
            while len(self._open) > self.max_requests:
                self._open.popitem(last=False)
        entry = self._open[rid]
        stops = self._stops.pop(rid, None)
        if entry is not None:
            entry.responses += 1
            entry.busy_ns += now - start_ns
            if stops:
                entry.events += stops
        if not meta.request_finished:
            return
        del self._open[rid]
        if entry is None:
            return
        error, attrs = None, {}
        if response.has_error():
            error = response.error().message()
        else:
            out = {x.name(): x.as_numpy() for x in response.output_tensors()}
            attrs[t.GEN_AI_USAGE_OUTPUT_TOKENS] = int(out["num_output_tokens"].reshape(-1)[0])
            reason = _text(out.get("finish_reason"))
            attrs[t.GEN_AI_RESPONSE_FINISH_REASONS] = [reason] if reason else None
        attrs.update({t.ATTR_PREFIX + "responses": entry.responses,
                      t.ATTR_PREFIX + "busy_seconds": entry.busy_ns / 1e9,
                      t.ATTR_PREFIX + "engine_request_id": rid})
        self.tracer.span("postprocess", entry.parent, entry.start_ns, now, attrs,
                         sorted(entry.events, key=lambda e: e[1]), error=error)

    def num_open(self) -> int:
        return len(self._open)


def _text(arr) -> str:
    if arr is None or not arr.size:
        return ""
    v = arr.reshape(-1)[0]
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
