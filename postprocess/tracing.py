"""Postprocess spans: one ``postprocess`` span per traced request (detokenization and stop matching
over all of its streamed responses), not one per response.

The span starts when the request's first llm response is processed and ends when its final one
is; its parent is Triton's ``postprocess`` span of that first response (like ``llm.generate``, it
outlives that parent, and lies within the ensemble's span). Events: ``stop_string_matched`` and
``engine_stop_sent`` (the BLS stop, with its reason and duration). ``triton_llm.busy_seconds`` is
the time actually spent in postprocess, as the span mostly covers waiting for tokens.

Only built when tracing is on (``PostprocessServing`` holds a ``PostprocessTracing`` then, else None).
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from contracts import tracing as t
from contracts import wire
from contracts.tracing import ModelTracer, request_trace_context


@dataclass
class _Open:
    parent: Any
    start_ns: int
    responses: int = 0
    busy_ns: int = 0
    output_tokens: int = 0
    finish_reason: str = ""
    error: str | None = None
    stop_matched: bool = False
    stop_sent_ns: int = 0        # when the BLS stop began (the stop string matched just before)
    events: list = field(default_factory=list)


class PostprocessTracing:
    def __init__(self, tracer: ModelTracer, pb_utils, max_requests: int = 4096):
        self.tracer = tracer
        self.pb = pb_utils
        self.max_requests = max_requests
        self._open: OrderedDict[str, _Open | None] = OrderedDict()   # None: seen, not traced

    def before(self, request) -> tuple[wire.LLMResponseMeta | None, int]:
        """Note the request's first response (reading Triton's span context once per request)."""
        start = time.time_ns()
        try:
            raw = self.pb.get_input_tensor_by_name(request, wire.RESPONSE).as_numpy().reshape(-1)[0]
            meta = wire.LLMResponseMeta.from_json(raw)
        except Exception:   # postprocess itself reports an unreadable response
            meta = None
        if meta is None or meta.stop_ack:
            return None, start
        if meta.request_id not in self._open:
            parent = self.tracer.parent(request_trace_context(request))
            self._open[meta.request_id] = _Open(parent, start) if parent is not None else None
            while len(self._open) > self.max_requests:
                self._open.popitem(last=False)
        return meta, start

    def engine_stop_sent(self, engine_id: str, reason: str, start_ns: int) -> None:
        entry = self._open.get(engine_id)
        if entry is not None:
            now = time.time_ns()
            entry.stop_sent_ns = start_ns
            entry.events.append(("engine_stop_sent", now, {t.ATTR_PREFIX + "stop_reason": reason,
                                                           t.ATTR_PREFIX + "bls_seconds": (now - start_ns) / 1e9}))

    def after(self, token: tuple[wire.LLMResponseMeta | None, int], response) -> None:
        meta, start_ns = token
        if meta is None:
            return
        entry = self._open.get(meta.request_id)
        now = time.time_ns()
        if entry is not None:
            entry.responses += 1
            entry.busy_ns += now - start_ns
            if response.has_error():
                entry.error = response.error().message()
            else:
                out = {x.name(): x.as_numpy() for x in response.output_tensors()}
                reason = _text(out.get("finish_reason"))
                if reason:
                    entry.finish_reason = reason
                if out.get("num_output_tokens") is not None:
                    entry.output_tokens = max(entry.output_tokens, int(out["num_output_tokens"].reshape(-1)[0]))
                if reason == "stop" and not (meta.finished or meta.request_finished) and not entry.stop_matched:
                    entry.stop_matched = True   # the engine did not stop it: a stop string matched here
                    at = entry.stop_sent_ns if entry.stop_sent_ns >= start_ns else now
                    entry.events.append(("stop_string_matched", at, {}))
        if meta.request_finished:
            self._open.pop(meta.request_id, None)
            if entry is not None:
                self.tracer.span("postprocess", entry.parent, entry.start_ns, now, {
                    t.GEN_AI_USAGE_OUTPUT_TOKENS: entry.output_tokens,
                    t.GEN_AI_RESPONSE_FINISH_REASONS: [entry.finish_reason] if entry.finish_reason else None,
                    t.ATTR_PREFIX + "responses": entry.responses,
                    t.ATTR_PREFIX + "busy_seconds": entry.busy_ns / 1e9,
                    t.ATTR_PREFIX + "engine_request_id": meta.request_id,
                }, sorted(entry.events, key=lambda e: e[1]), error=entry.error)

    def num_open(self) -> int:
        return len(self._open)


def _text(arr) -> str:
    if arr is None or not arr.size:
        return ""
    v = arr.reshape(-1)[0]
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
