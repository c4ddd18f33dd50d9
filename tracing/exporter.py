"""A model process's span exporter (torch-free): spans under Triton's context, exported in bounded batches.

Turned on by the standard environment: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (OTLP over HTTP, e.g.
``http://localhost:4318``; ``/v1/traces`` is appended) or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
(the full URL), ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` /
``OTEL_TRACES_SAMPLER_ARG``; ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turn it off.

Who decides what is traced: tritonserver. The launcher maps the sampler onto tritonserver's own
``--trace-config rate`` (``TracingSettings.triton_args``); a Python model only ever creates spans as
children of a sampled span context Triton gives it (``request.trace().get_context()``) and never
starts a trace of its own (parent-based sampling). So a request is traced in every stage or in none. When the environment does not turn tracing on, ``ModelTracer.from_env`` returns None and
the models run no tracing code per request (the OpenTelemetry SDK is not even imported).

Spans are made after the fact with explicit start and end times (``ModelTracer.span``) and
exported by a ``BatchSpanProcessor`` with a bounded queue (spans beyond it are dropped, never
waited for) and an exporter whose every export, retries included, ends within
``export_timeout_s``: a collector that is down or hangs costs spans, not responses.
"""
from __future__ import annotations

import logging
import random
import sys
import threading
import time
from typing import Any, Iterable, Mapping

from tracing.context import _carrier, parse_traceparent
from tracing.settings import TracingConfigError, TracingSettings

log = logging.getLogger(__name__)


class _RateLimit(logging.Filter):
    """At most one record per message template every ``interval_s`` (an unreachable collector would
    otherwise log a warning per dropped span)."""

    def __init__(self, interval_s: float = 30.0):
        super().__init__()
        self.interval_s = interval_s
        self._last: dict[tuple[str, Any], float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.msg)
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(key, -1e9) < self.interval_s:
                return False
            self._last[key] = now
        return True


def _limit_sdk_logging() -> None:
    logger = logging.getLogger("opentelemetry")
    if any(isinstance(f, _RateLimit) for h in logger.handlers for f in h.filters):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    handler.addFilter(_RateLimit())
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False


Event = tuple[str, int, Mapping[str, Any]]   # (name, Unix nanos, attributes)


class ModelTracer:
    """One model process's tracer: makes spans under Triton's context and exports them in batches.

    Spans are built directly as the SDK's ``ReadableSpan`` (what exporters consume) and handed to the
    batch processor, instead of going through ``Tracer.start_span``: the SDK's per-attribute validation
    made that ~530 us of CPU for the llm's four spans, on the process that runs the engine. The
    attributes are ours and of valid types (``_clean``); sampling is parent-based by construction (a
    span needs a sampled parent, ``parent()``), so no sampler runs either. The gateway, the one place a
    trace may start, uses the same class for its server span (``gateway/tracing.py``: ``new_context`` and
    ``span(..., context=)``), sampling a new trace by ``ratio_samples``.
    """

    def __init__(self, settings: TracingSettings, model_name: str, exporter=None, *,
                 resource_key: str = "triton.model_name"):
        from opentelemetry import trace
        from opentelemetry.sdk import trace as sdk_trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self._api, self._sdk = trace, sdk_trace     # imported once tracing is on, never when it is off
        self._unset, self._kinds = trace.Status(trace.StatusCode.UNSET), {k.name: k for k in trace.SpanKind}
        self.settings = settings
        self.model_name = model_name
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=settings.traces_url, timeout=settings.export_timeout_s)
            _limit_sdk_logging()
        self.resource = Resource.create({**dict(settings.resource_attributes), "service.name": settings.service_name,
                                         resource_key: model_name})
        self.scope = InstrumentationScope("triton_llm." + model_name)
        self.processor = BatchSpanProcessor(exporter, max_queue_size=settings.max_queue_size,
                                            schedule_delay_millis=settings.schedule_delay_ms,
                                            max_export_batch_size=settings.max_export_batch_size,
                                            export_timeout_millis=settings.export_timeout_s * 1000)
        self._ids = random.Random()

    @classmethod
    def from_env(cls, model_name: str, env: Mapping[str, str] | None = None) -> "ModelTracer | None":
        """A tracer when the environment turns tracing on, else None. A bad OTEL_* value is logged and
        leaves tracing off (the launcher refuses it before the server starts)."""
        try:
            settings = TracingSettings.from_env(env)
        except TracingConfigError as e:
            log.error("tracing off: %s", e)
            return None
        return cls(settings, model_name) if settings is not None else None

    @staticmethod
    def parent(trace_context: Any):
        """The span context of Triton's span (a W3C traceparent in ``get_context()``'s text), or None when it
        is absent, malformed or not sampled."""
        from opentelemetry.trace import SpanContext, TraceFlags

        carrier = _carrier(trace_context)
        parsed = parse_traceparent((carrier or {}).get("traceparent", ""))
        if parsed is None or not parsed.sampled:
            return None
        return SpanContext(parsed.trace_id, parsed.span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))

    def new_context(self, parent=None):
        """A fresh sampled span context: a child of ``parent`` (a span context), or a new trace's root without
        one. For a span whose id must be known before it ends (``span(..., context=)``), e.g. to forward it."""
        trace_id = parent.trace_id if parent is not None else (self._ids.getrandbits(128) or 1)
        return self._api.SpanContext(trace_id, self._ids.getrandbits(64) or 1, is_remote=False,
                                     trace_flags=self._api.TraceFlags(self._api.TraceFlags.SAMPLED))

    def span(self, name: str, parent, start_ns: int, end_ns: int, attributes: Mapping[str, Any] | None = None,
             events: Iterable[Event] = (), kind: str = "INTERNAL", error: str | None = None, context=None):
        """Record a finished span under ``parent`` (a span context from ``parent()`` or from another
        ``span()``; nothing is recorded without one, unless ``context`` from ``new_context()`` is given: then
        that is the span's own context, and ``parent`` None makes it a root), with status ERROR and ``error``
        as its description when given. Returns the new span's context, to parent further spans on."""
        if parent is None and context is None:
            return None
        api, sdk = self._api, self._sdk
        if context is None:
            context = api.SpanContext(parent.trace_id, self._ids.getrandbits(64) or 1, is_remote=False,
                                      trace_flags=parent.trace_flags)
        span = sdk.ReadableSpan(
            name=name, context=context, parent=parent, resource=self.resource, attributes=_clean(attributes),
            events=tuple(sdk.Event(n, _clean(a), ts) for n, ts, a in events), kind=self._kinds[kind],
            status=api.Status(api.StatusCode.ERROR, error) if error else self._unset,
            start_time=start_ns, end_time=max(end_ns, start_ns), instrumentation_scope=self.scope)
        self.processor.on_end(span)
        return context

    def shutdown(self, timeout_s: float = 2.0) -> bool:
        """Flush what can be sent within ``timeout_s`` and stop the export thread; returns False when
        the flush was left running (a collector that hangs), which never delays the caller longer."""
        done = threading.Thread(target=self.processor.shutdown, name="otel-shutdown", daemon=True)
        done.start()
        done.join(timeout_s)
        return not done.is_alive()


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """Drop None values (OpenTelemetry has no null); tuples become lists."""
    if not attributes:
        return {}
    return {k: list(v) if type(v) is tuple else v for k, v in attributes.items() if v is not None}
