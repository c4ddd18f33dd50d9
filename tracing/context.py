"""W3C trace context: ``traceparent`` parsing and formatting, Triton's span context text, span clocks; a model's
requests answered inside its tracing helper (``TracedServing``)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Mapping

def trace_id_of(trace_context: str | None) -> str | None:
    """The 32-hex trace id in Triton's ``get_context()`` text (``{"traceparent": "00-<trace>-<span>-01"}``)."""
    carrier = _carrier(trace_context)
    parts = (carrier or {}).get("traceparent", "").split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


@dataclass(frozen=True)
class TraceParent:
    """A parsed W3C ``traceparent`` header."""

    trace_id: int
    span_id: int
    sampled: bool


def parse_traceparent(value: str | None) -> TraceParent | None:
    """``00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`` (later versions may append fields), or None
    when absent or malformed (version ff, all-zero ids, wrong lengths)."""
    parts = (value or "").strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff" or len(parts[1]) != 32 or len(parts[2]) != 16 \
            or len(parts[3]) < 2 or (parts[0] == "00" and len(parts) != 4):
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3][:2], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return TraceParent(trace_id, span_id, bool(flags & 1))


def format_traceparent(trace_id: int, span_id: int, sampled: bool = True) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def ratio_samples(trace_id: int, ratio: float) -> bool:
    """The spec's TraceIdRatioBased decision for a new trace: its trace id's low 64 bits below ratio * 2**64."""
    return (trace_id & 0xFFFFFFFFFFFFFFFF) < int(ratio * 2**64)


def _carrier(trace_context: Any) -> dict[str, str] | None:
    if not trace_context:
        return None
    if isinstance(trace_context, Mapping):
        return {str(k): str(v) for k, v in trace_context.items()}
    try:
        d = json.loads(trace_context)
    except (TypeError, ValueError):
        return None
    return {str(k): str(v) for k, v in d.items()} if isinstance(d, dict) else None


def request_trace_context(request) -> str | None:
    """Triton's span context text for a request (None when Triton does not trace it). Call it while
    the request is valid: in execute(), or in a decoupled model before its final response."""
    try:
        trace = request.trace()
        return trace.get_context() if trace is not None else None
    except Exception:   # an older stub without trace(), or a released request
        return None


class TracedServing:
    """A Python model's serving logic that answers each request with one response (preprocess, postprocess):
    ``execute`` answers a batch in order through ``process``, which wraps the subclass's ``_process(request)``
    in the model's tracing helper (``self.tracing``: ``before(request)`` / ``after(token, response)``; None
    while tracing is off, then ``_process`` is just called)."""

    tracing: Any = None

    def execute(self, requests) -> list:
        return [self.process(r) for r in requests]

    def process(self, request):
        tracing = self.tracing
        if tracing is None:
            return self._process(request)
        token = tracing.before(request)
        response = self._process(request)
        tracing.after(token, response)
        return response

    def _process(self, request):
        raise NotImplementedError


def unix_nanos(monotonic_s: float, offset_s: float) -> int:
    """A ``time.monotonic()`` reading as Unix-epoch nanoseconds (``offset_s = time.time() - time.monotonic()``)."""
    return int((monotonic_s + offset_s) * 1e9)


def monotonic_offset() -> float:
    return time.time() - time.monotonic()
