"""An in-memory ModelTracer for unit tests, and a Triton span context to parent spans on."""
from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracing import ModelTracer, TracingSettings

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRITON_SPAN_ID = "b7ad6b7169203331"
TRITON_CONTEXT = '{"traceparent":"00-%s-%s-01"}' % (TRACE_ID, TRITON_SPAN_ID)
UNSAMPLED_CONTEXT = '{"traceparent":"00-%s-%s-00"}' % (TRACE_ID, TRITON_SPAN_ID)


class MemoryTracer(ModelTracer):
    """A ModelTracer exporting to memory; ``finished()`` flushes and returns the spans by name."""

    def __init__(self, model_name: str = "test"):
        self.exporter = InMemorySpanExporter()
        super().__init__(TracingSettings("http://unused:1/v1/traces", schedule_delay_ms=10), model_name,
                         exporter=self.exporter)

    def finished(self) -> list:
        self.processor.force_flush()
        return list(self.exporter.get_finished_spans())


def span_id(span) -> str:
    return format(span.context.span_id, "016x")


def parent_id(span) -> str | None:
    return format(span.parent.span_id, "016x") if span.parent is not None else None


def within(child, parent, slack_ns: int = 0) -> bool:
    return parent.start_time - slack_ns <= child.start_time and child.end_time <= parent.end_time + slack_ns
