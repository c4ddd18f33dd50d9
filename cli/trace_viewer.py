"""A trace viewer for machines without Jaeger: an OTLP/HTTP receiver that prints each trace as a waterfall.

    python -m cli.trace_viewer                      # listens on :4318, as Jaeger / the Collector would
    OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 make serve      # in another terminal
    python -m cli.client "def fibonacci(n):" --max-tokens 32

Each trace is printed once no span of it has arrived for ``--idle`` seconds (default: 1.5 times the
exporters' batch delay: ``OTEL_BSP_SCHEDULE_DELAY`` when set here, else the 1 s ``make serve`` gives its
exporters when traces go to this machine, so a trace prints about 1.5-2.5 s after its request ends; each
process exports its spans on its own schedule, so one trace's spans arrive up to one delay apart), one span a line:
indented under its parent, with its service, start offset from the trace's first span, duration,
and its key attributes and events::

    trace 0af7651916cd43dd8448eb211c80319c  (14 spans, 212.4 ms)
    InferRequest                       triton-llm                   +0.0ms   212.4ms
      ensemble                         triton-llm                   +0.1ms   210.3ms  model=ensemble
        preprocess                     triton-llm                   +0.3ms     2.1ms  model=preprocess
          preprocess                   triton-llm/preprocess        +0.6ms     1.2ms  input_tokens=5
    ...

tritonserver posts OTLP/JSON (ids as hex strings); the OpenTelemetry Python SDK posts protobuf; both are
read (gzip too) by ``cli.otlp``. ``OTLPReceiver`` and ``render_trace`` are reused by the end-to-end tests.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping

from cli.otlp import Span, decode
from tracing import LOCAL_SCHEDULE_DELAY_MS

TRACES_PATH = "/v1/traces"
# attributes worth a place on the waterfall line (short label: attribute)
KEY_ATTRIBUTES = {
    "model": "triton.model_name",
    "input_tokens": "gen_ai.usage.input_tokens",
    "cached": "gen_ai.usage.cache_read.input_tokens",
    "output_tokens": "gen_ai.usage.output_tokens",
    "max_tokens": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "seed": "gen_ai.request.seed",
    "finish": "gen_ai.response.finish_reasons",
    "chunks": "triton_llm.prefill_chunks",
    "steps": "triton_llm.decode_steps",
    "preemptions": "triton_llm.preemptions",
    "responses": "triton_llm.responses",
    "busy_s": "triton_llm.busy_seconds",
    "stopped_by": "triton_llm.stopped_by",
    "chat": "triton_llm.chat",
}
# Triton's own span events are timestamps of its stages; they are not repeated on the waterfall.
TRITON_EVENTS = {"REQUEST_START", "QUEUE_START", "REQUEST_END", "COMPUTE_START", "COMPUTE_INPUT_END",
                 "COMPUTE_OUTPUT_START", "COMPUTE_END", "GRPC_WAITREAD_START", "GRPC_WAITREAD_END",
                 "GRPC_SEND_START", "GRPC_SEND_END", "INFER_RESPONSE_COMPLETE", "HTTP_RECV_START", "HTTP_RECV_END",
                 "HTTP_SEND_START", "HTTP_SEND_END"}


# ---- the receiver -------------------------------------------------------------------------------

def quiet_period_s(schedule_delay_ms: int) -> float:
    """How long a trace must receive no span before it counts as complete: longer than the batch delay
    that can separate two processes' exports of one trace's spans."""
    return 1.5 * schedule_delay_ms / 1000.0


def default_idle_s(env: Mapping[str, str]) -> float:
    """``quiet_period_s`` of ``OTEL_BSP_SCHEDULE_DELAY`` (ms), the setting the server's exporters read; unset,
    of ``LOCAL_SCHEDULE_DELAY_MS``, the delay ``make serve`` sets for a receiver on this machine."""
    raw = env.get("OTEL_BSP_SCHEDULE_DELAY", "").strip()
    if not raw:
        return quiet_period_s(LOCAL_SCHEDULE_DELAY_MS)
    if not raw.isdigit() or int(raw) <= 0:
        raise ValueError(f"OTEL_BSP_SCHEDULE_DELAY: expected a whole number of milliseconds > 0, got {raw!r}")
    return quiet_period_s(int(raw))


class TraceStore:
    """Spans by trace id, thread-safe; ``clock`` (seconds) times each trace's last span."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Condition()
        self._traces: dict[str, list[Span]] = {}
        self._last: dict[str, float] = {}
        self.requests = 0
        self.errors = 0

    def add(self, spans: list[Span]) -> None:
        with self._lock:
            for s in spans:
                self._traces.setdefault(s.trace_id, []).append(s)
                self._last[s.trace_id] = self._clock()
            self.requests += 1
            self._lock.notify_all()

    def trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return list(self._traces.get(trace_id, []))

    def trace_ids(self) -> list[str]:
        with self._lock:
            return list(self._traces)

    def all_spans(self) -> list[Span]:
        with self._lock:
            return [s for spans in self._traces.values() for s in spans]

    def pop_idle(self, idle_s: float) -> list[list[Span]]:
        """Traces that received no span for ``idle_s`` seconds, removed from the store."""
        now = self._clock()
        with self._lock:
            done = [t for t, last in self._last.items() if now - last >= idle_s]
            out = [self._traces.pop(t) for t in done]
            for t in done:
                del self._last[t]
        return out

    def wait_for(self, predicate: Callable[["TraceStore"], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._lock:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.2))
            return True

    def clear(self) -> None:
        with self._lock:
            self._traces.clear()
            self._last.clear()


class OTLPHandler(BaseHTTPRequestHandler):
    server: "OTLPReceiver"

    def do_POST(self):  # noqa: N802 (http.server's name)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        content_type = self.headers.get("Content-Type", "")
        if self.path.rstrip("/") != TRACES_PATH:
            self._reply(404, b"{}", "application/json")
            return
        try:
            spans = decode(body, content_type, self.headers.get("Content-Encoding", ""))
        except Exception as e:
            self.server.store.errors += 1
            self._reply(400, json.dumps({"error": str(e)}).encode(), "application/json")
            return
        self.server.store.add(spans)
        if "json" in content_type.lower():
            self._reply(200, b"{}", "application/json")
        else:
            self._reply(200, b"", "application/x-protobuf")   # an empty ExportTraceServiceResponse

    def _reply(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # quiet
        pass


class OTLPReceiver(ThreadingHTTPServer):
    """An OTLP/HTTP traces endpoint (``POST /v1/traces``, JSON or protobuf) collecting into ``store``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str = "127.0.0.1", port: int = 4318, handler=None):
        super().__init__((host, port), handler or OTLPHandler)
        self.store = TraceStore()
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "OTLPReceiver":
        self._thread = threading.Thread(target=self.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


# ---- the waterfall ------------------------------------------------------------------------------

def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return ",".join(_fmt(x) for x in v)
    return str(v)


def span_tree(spans: list[Span]) -> list[tuple[int, Span]]:
    """(depth, span) in waterfall order: parents before children, siblings by start time. Spans whose
    parent is not in the trace (the caller's own span, or one still in flight) are roots."""
    ids = {s.span_id for s in spans}
    children: dict[str | None, list[Span]] = {}
    for s in spans:
        children.setdefault(s.parent_id if s.parent_id in ids else None, []).append(s)
    out: list[tuple[int, Span]] = []

    def walk(parent: str | None, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda x: (x.start_ns, -x.end_ns)):
            out.append((depth, s))
            walk(s.span_id, depth + 1)
    walk(None, 0)
    return out


def render_trace(spans: list[Span], width: int = 34) -> str:
    if not spans:
        return ""
    t0 = min(s.start_ns for s in spans)
    t1 = max(s.end_ns for s in spans)
    lines = [f"trace {spans[0].trace_id}  ({len(spans)} spans, {(t1 - t0) / 1e6:.1f} ms)"]
    for depth, s in span_tree(spans):
        attrs = [f"{label}={_fmt(s.attributes[key])}" for label, key in KEY_ATTRIBUTES.items()
                 if key in s.attributes and s.attributes[key] is not None]
        counts: dict[str, int] = {}
        firsts: dict[str, int] = {}
        for name, ts, _ in s.events:
            if name in TRITON_EVENTS:
                continue
            counts[name] = counts.get(name, 0) + 1
            firsts.setdefault(name, ts)
        events = [f"{n}@+{(firsts[n] - t0) / 1e6:.1f}ms" if c == 1 else f"{n}x{c}" for n, c in counts.items()]
        status = f"  ERROR: {s.status_message}" if s.status == "ERROR" else ""
        name = ("  " * depth + s.name)[:width]
        lines.append(f"{name:<{width}} {s.service[:26]:<26} {'+%.1fms' % ((s.start_ns - t0) / 1e6):>9} "
                     f"{'%.1fms' % (s.duration_ns / 1e6):>9}  {' '.join(attrs)}"
                     + (f"  [{' '.join(events)}]" if events else "") + status)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=4318)
    ap.add_argument("--idle", type=float, help="print a trace once no span came for this long, in seconds "
                    "(default: 1.5 x $OTEL_BSP_SCHEDULE_DELAY, else 1.5 x the 1000 ms make serve sets for a "
                    "receiver on this machine; a server exporting every 5 s needs --idle 7.5)")
    ap.add_argument("--jsonl", type=argparse.FileType("a"), help="also append every span to this file as JSON lines")
    args = ap.parse_args(argv)
    if args.idle is None:
        try:
            args.idle = default_idle_s(os.environ)
        except ValueError as e:
            ap.error(str(e))
    receiver = OTLPReceiver(args.host, args.port).start()
    print(f"OTLP/HTTP receiver on {receiver.endpoint}{TRACES_PATH}; "
          f"set OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:{args.port}", flush=True)
    try:
        while True:
            time.sleep(min(0.5, args.idle))
            for spans in receiver.store.pop_idle(args.idle):
                print(render_trace(spans) + "\n", flush=True)
                if args.jsonl:
                    for s in spans:
                        args.jsonl.write(json.dumps(s.__dict__, default=str) + "\n")
                    args.jsonl.flush()
    except KeyboardInterrupt:
        return 0
    finally:
        receiver.stop()


if __name__ == "__main__":
    sys.exit(main())
