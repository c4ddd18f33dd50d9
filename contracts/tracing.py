"""OpenTelemetry tracing shared by the three Python models, the gateway and the launcher (torch-free).

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

import json
import logging
import os
import random
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

DEFAULT_SERVICE_NAME = "triton-llm"
TRACES_PATH = "/v1/traces"
SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
            "parentbased_traceidratio")

# OpenTelemetry GenAI semantic conventions (attribute names), and ours where none exists.
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"
GEN_AI_REQUEST_FREQUENCY_PENALTY = "gen_ai.request.frequency_penalty"
GEN_AI_REQUEST_PRESENCE_PENALTY = "gen_ai.request.presence_penalty"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"
GEN_AI_REQUEST_STOP_SEQUENCES = "gen_ai.request.stop_sequences"
GEN_AI_REQUEST_CHOICE_COUNT = "gen_ai.request.choice.count"
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
ATTR_PREFIX = "triton_llm."

log = logging.getLogger(__name__)


class TracingConfigError(ValueError):
    """An OTEL_* variable this deployment cannot honour (the message names it)."""


@dataclass(frozen=True)
class TracingSettings:
    traces_url: str                       # the OTLP/HTTP traces URL (…/v1/traces)
    service_name: str = DEFAULT_SERVICE_NAME
    resource_attributes: tuple[tuple[str, str], ...] = ()
    sampler: str = "parentbased_always_on"
    ratio: float = 1.0                    # share of requests traced (from the sampler)
    max_queue_size: int = 2048            # spans buffered per process (OTEL_BSP_MAX_QUEUE_SIZE); more are dropped
    max_export_batch_size: int = 512      # OTEL_BSP_MAX_EXPORT_BATCH_SIZE: a full batch is exported at once
    schedule_delay_ms: int = 5000         # OTEL_BSP_SCHEDULE_DELAY (the spec's default): the longest a span waits
    export_timeout_s: float = 3.0         # one export, retries included

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "TracingSettings | None":
        """The settings the environment asks for, or None when tracing is off. Raises
        ``TracingConfigError`` naming the variable when a value cannot be honoured."""
        env = os.environ if env is None else env
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return None
        exporter = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
        if exporter == "none":
            return None
        if exporter != "otlp":
            raise TracingConfigError(f"OTEL_TRACES_EXPORTER: only 'otlp' (or 'none') is supported, got {exporter!r}")
        url = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        if not url:
            base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
            if not base:
                return None
            url = base.rstrip("/") + TRACES_PATH
        if not url.startswith(("http://", "https://")):
            raise TracingConfigError(f"OTEL_EXPORTER_OTLP_ENDPOINT: expected an http(s):// URL, got {url!r}")
        for var in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
            protocol = env.get(var, "").strip().lower()
            if protocol and protocol != "http/protobuf" and protocol != "http/json":
                raise TracingConfigError(f"{var}: tritonserver exports OTLP over HTTP only, got {protocol!r}")
            if protocol:
                break
        sampler, ratio = parse_sampler(env.get("OTEL_TRACES_SAMPLER", ""), env.get("OTEL_TRACES_SAMPLER_ARG", ""))
        service = env.get("OTEL_SERVICE_NAME", "").strip() or DEFAULT_SERVICE_NAME
        resource = parse_resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES", ""))
        timeout = env.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or env.get("OTEL_EXPORTER_OTLP_TIMEOUT")
        kwargs: dict[str, Any] = {}
        if timeout:
            try:
                kwargs["export_timeout_s"] = float(timeout) / 1000.0   # the spec's unit: milliseconds
            except ValueError:
                raise TracingConfigError(f"OTEL_EXPORTER_OTLP_TIMEOUT: expected milliseconds, got {timeout!r}") from None
        for var, name in (("OTEL_BSP_MAX_QUEUE_SIZE", "max_queue_size"),
                          ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "max_export_batch_size"),
                          ("OTEL_BSP_SCHEDULE_DELAY", "schedule_delay_ms")):
            raw = env.get(var, "").strip()
            if raw:
                try:
                    kwargs[name] = int(raw)
                except ValueError:
                    raise TracingConfigError(f"{var}: expected a whole number, got {raw!r}") from None
                if kwargs[name] <= 0:
                    raise TracingConfigError(f"{var}: must be > 0, got {raw!r}")
        queue_size = kwargs.get("max_queue_size", cls.max_queue_size)
        batch_size = kwargs.get("max_export_batch_size", cls.max_export_batch_size)
        if batch_size > queue_size:
            raise TracingConfigError(f"OTEL_BSP_MAX_EXPORT_BATCH_SIZE: {batch_size} is more than the queue "
                                     f"(OTEL_BSP_MAX_QUEUE_SIZE {queue_size})")
        return cls(url, service, resource, sampler, ratio, **kwargs)

    @property
    def triton_rate(self) -> int | None:
        """tritonserver's ``rate`` (trace one request in N), or None when nothing is sampled."""
        if self.ratio <= 0.0:
            return None
        return max(1, round(1.0 / self.ratio))

    def triton_args(self) -> list[str]:
        """tritonserver flags for its OpenTelemetry mode. With the sampler off the mode is still set,
        at level OFF, so tracing can be turned on at run time (``POST /v2/trace/setting``)."""
        rate = self.triton_rate
        args = ["mode=opentelemetry", f"opentelemetry,url={self.traces_url}",
                f"level={'TIMESTAMPS' if rate else 'OFF'}", f"rate={rate or 1}", "count=-1",
                f"opentelemetry,resource=service.name={self.service_name}",
                f"opentelemetry,bsp_max_queue_size={self.max_queue_size}",
                f"opentelemetry,bsp_max_export_batch_size={self.max_export_batch_size}",
                f"opentelemetry,bsp_schedule_delay={self.schedule_delay_ms}"]
        args += [f"opentelemetry,resource={k}={v}" for k, v in self.resource_attributes if k != "service.name"]
        return [a for arg in args for a in ("--trace-config", arg)]


def parse_sampler(name: str, arg: str) -> tuple[str, float]:
    """``(sampler, ratio)`` from OTEL_TRACES_SAMPLER / _ARG (the spec's default: parentbased_always_on)."""
    name = (name or "parentbased_always_on").strip().lower()
    if name not in SAMPLERS:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER: expected one of {', '.join(SAMPLERS)}, got {name!r}")
    if name.endswith("always_on"):
        return name, 1.0
    if name.endswith("always_off"):
        return name, 0.0
    try:
        ratio = float(arg) if arg.strip() else 1.0
    except ValueError:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER_ARG: expected a ratio in [0, 1], got {arg!r}") from None
    if not 0.0 <= ratio <= 1.0:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER_ARG: expected a ratio in [0, 1], got {arg!r}")
    return name, ratio


def parse_resource_attributes(raw: str) -> tuple[tuple[str, str], ...]:
    """``"k1=v1,k2=v2"`` (OTEL_RESOURCE_ATTRIBUTES) as pairs; malformed items are skipped."""
    pairs = []
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            pairs.append((key.strip(), value.strip()))
    return tuple(pairs)


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


def traced_call(tracing, request, process: Callable[[Any], Any]):
    """``process(request)``, wrapped in ``tracing.before(request)`` / ``tracing.after(token, response)``
    when a model's tracing helper exists (tracing on), else just called."""
    if tracing is None:
        return process(request)
    token = tracing.before(request)
    response = process(request)
    tracing.after(token, response)
    return response


def unix_nanos(monotonic_s: float, offset_s: float) -> int:
    """A ``time.monotonic()`` reading as Unix-epoch nanoseconds (``offset_s = time.time() - time.monotonic()``)."""
    return int((monotonic_s + offset_s) * 1e9)


def monotonic_offset() -> float:
    return time.time() - time.monotonic()


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
