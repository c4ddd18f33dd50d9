"""OpenTelemetry tracing shared by the three Python models, the gateway and the launcher (torch-free).

Turned on by the standard environment (``OTEL_EXPORTER_OTLP_ENDPOINT`` and friends, ``settings.py``).
tritonserver decides what is traced: a Python model only makes spans as children of the sampled span
context Triton gives it (``context.py``), exported in bounded batches (``exporter.py``), so a request is
traced in every stage or in none. Span attribute names live in ``attributes.py``.
"""
from tracing.attributes import *  # noqa: F401,F403
from tracing.context import (TraceParent, format_traceparent, monotonic_offset, parse_traceparent,  # noqa: F401
                             ratio_samples, request_trace_context, trace_id_of, TracedServing, unix_nanos)
from tracing.exporter import Event, ModelTracer  # noqa: F401
from tracing.settings import (DEFAULT_SERVICE_NAME, LOCAL_SCHEDULE_DELAY_MS, SAMPLERS, TRACES_PATH,  # noqa: F401
                              TracingConfigError, TracingSettings, parse_resource_attributes, parse_sampler)
