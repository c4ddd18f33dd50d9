"""OTLP/HTTP trace bodies as ``Span`` records: tritonserver's OTLP/JSON (ids as hex strings) and the
OpenTelemetry SDK's protobuf, gzip or deflate encoded (``decode``). The trace viewer and the tests read
spans through it."""
from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable


@dataclass
class Span:
    trace_id: str                       # 32 hex
    span_id: str                        # 16 hex
    parent_id: str | None               # 16 hex, None for a root
    name: str
    service: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    status: str = "UNSET"               # UNSET | OK | ERROR
    status_message: str = ""
    resource: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


# ---- decoding -----------------------------------------------------------------------------------

def _json_value(v: dict) -> Any:
    if not isinstance(v, dict) or not v:
        return None
    kind, val = next(iter(v.items()))
    if kind == "intValue":
        return int(val)
    if kind == "doubleValue":
        return float(val)
    if kind == "arrayValue":
        return [_json_value(x) for x in val.get("values", [])]
    if kind == "kvlistValue":
        return {kv["key"]: _json_value(kv.get("value", {})) for kv in val.get("values", [])}
    return val


def _json_attrs(items: Iterable[dict]) -> dict[str, Any]:
    return {kv["key"]: _json_value(kv.get("value", {})) for kv in items or []}


def _hex_id(value: str, size: int) -> str | None:
    """OTLP/JSON ids are hex (the spec, and tritonserver); some exporters send base64: accept both."""
    if not value:
        return None
    if len(value) == size * 2:
        return value.lower()
    import base64

    raw = base64.b64decode(value)
    return raw.hex() if any(raw) else None


_STATUS = {0: "UNSET", 1: "OK", 2: "ERROR", "STATUS_CODE_UNSET": "UNSET", "STATUS_CODE_OK": "OK",
           "STATUS_CODE_ERROR": "ERROR"}


def parse_json(body: bytes) -> list[Span]:
    data = json.loads(body)
    spans = []
    for rs in data.get("resourceSpans", []):
        resource = _json_attrs(rs.get("resource", {}).get("attributes", []))
        service = _service(resource)
        for ss in rs.get("scopeSpans", []) or rs.get("instrumentationLibrarySpans", []):
            for s in ss.get("spans", []):
                status = s.get("status", {}) or {}
                spans.append(Span(
                    trace_id=_hex_id(s["traceId"], 16), span_id=_hex_id(s["spanId"], 8),
                    parent_id=_hex_id(s.get("parentSpanId", ""), 8), name=s.get("name", ""), service=service,
                    start_ns=int(s.get("startTimeUnixNano", 0)), end_ns=int(s.get("endTimeUnixNano", 0)),
                    attributes=_json_attrs(s.get("attributes", [])),
                    events=[(e.get("name", ""), int(e.get("timeUnixNano", 0)), _json_attrs(e.get("attributes", [])))
                            for e in s.get("events", [])],
                    status=_STATUS.get(status.get("code", 0), "UNSET"), status_message=status.get("message", ""),
                    resource=resource))
    return spans


def _proto_value(v) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_proto_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _proto_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind)


def parse_protobuf(body: bytes) -> list[Span]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    spans = []
    for rs in req.resource_spans:
        resource = {kv.key: _proto_value(kv.value) for kv in rs.resource.attributes}
        service = _service(resource)
        for ss in rs.scope_spans:
            for s in ss.spans:
                spans.append(Span(
                    trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                    parent_id=s.parent_span_id.hex() or None, name=s.name, service=service,
                    start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                    attributes={kv.key: _proto_value(kv.value) for kv in s.attributes},
                    events=[(e.name, e.time_unix_nano, {kv.key: _proto_value(kv.value) for kv in e.attributes})
                            for e in s.events],
                    status=_STATUS.get(s.status.code, "UNSET"), status_message=s.status.message, resource=resource))
    return spans


def _service(resource: dict[str, Any]) -> str:
    service = str(resource.get("service.name", "?"))
    model = resource.get("triton.model_name") or resource.get("triton_llm.component")   # a model, or the gateway
    return f"{service}/{model}" if model else service


def decode(body: bytes, content_type: str, content_encoding: str = "") -> list[Span]:
    encoding = (content_encoding or "").lower()
    if encoding == "gzip":
        body = gzip.decompress(body)
    elif encoding == "deflate":
        body = zlib.decompress(body)
    if "json" in (content_type or "").lower():
        return parse_json(body)
    return parse_protobuf(body)
