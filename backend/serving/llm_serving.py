"""The ``llm`` Triton model's logic: requests in, engine outputs out as decoupled responses.

``execute()`` only submits: every request is handed to the engine with its response sender and
``execute`` returns. Responses are sent from the engine thread's ``on_output`` callback. Rules:
- a request whose ``stop`` input is true aborts the request it names (by Triton request id: the
  engine's id, which postprocess uses, or the client's id) and gets its own final response at once,
  never waiting on the engine loop;
- a watcher thread polls ``is_cancelled()`` of in-flight requests and aborts the cancelled ones;
- every stream ends with a response flagged ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``, whatever
  happens: a failed request ends with ``meta.error`` set (postprocess turns it into a ``TritonError``
  naming the field, and drops its state for the request);
- each finished request goes to ``telemetry`` (histograms, the JSON log line, spans when traced:
  backend/serving/telemetry.py), which runs on its own thread.
- a watchdog (``backend/serving/health.py``) declares the engine unhealthy when its loop dies or stalls
  with work waiting: every in-flight request then ends with an error, new ones are refused, and by
  default tritonserver is asked to shut down so that its readiness tells the truth.

``pb_utils`` (Triton's ``triton_python_backend_utils``) is passed in, so this module runs in tests
without the server.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from backend.core.outputs import RequestOutput
from backend.serving.telemetry import FinishedRequest
from contracts import wire
from contracts.field_names import as_ensemble_error
from tracing import monotonic_offset, request_trace_context
from contracts.triton_config import model_parameters, positive_float_param, resolve_paths

log = logging.getLogger(__name__)

# config.pbtxt parameters read by this module (the others go to EngineConfig.from_parameters).
SERVING_PARAMETERS = {"cancel_poll_interval_s": "0.2", "metrics_interval_s": "1.0", "request_log_level": "info",
                      "engine_stall_timeout_s": "30", "engine_unhealthy_action": "shutdown"}


CANCEL_CHECKS_PER_SWEEP = 16   # is_cancelled() calls per cancel_poll_interval_s, over all requests in flight


def split_parameters(params: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(engine parameters, serving parameters with defaults)."""
    serving = {k: params.get(k) or d for k, d in SERVING_PARAMETERS.items()}
    engine = {k: v for k, v in params.items() if k not in SERVING_PARAMETERS}
    return engine, serving


@dataclass
class _InFlight:
    engine_id: str
    client_id: str
    request: Any                      # the Triton request (for is_cancelled)
    sender: Any                       # its response sender
    stream: bool
    options: str
    seen_seqs: set = field(default_factory=set)
    pending: dict = field(default_factory=dict)  # non-stream: seq_index -> (token ids, logprobs, options) held until it ends
    aborted: bool = False
    cancel_checked_at: float = 0.0    # time.monotonic() of the last is_cancelled() call
    # for telemetry (only when it is on)
    params: Any = None                # the request's SamplingParams
    prompt_sha256: str = ""
    num_prompt_tokens: int = 0
    trace_context: str | None = None  # Triton's span context (only when tracing is on)
    stopped_by: str | None = None     # stop_string | cancelled | error (postprocess) | stop_request (client)
    stopped_at: float | None = None   # time.monotonic() of the stop
    output_hashes: dict = field(default_factory=dict)   # seq_index -> sha256 of its output token ids
    finish_reasons: dict = field(default_factory=dict)  # seq_index -> finish reason


class LLMServing:
    """Owns the in-flight table between Triton's requests and the engine's callbacks."""

    def __init__(self, engine, pb_utils, *, cancel_poll_interval_s: float = 0.2, metrics=None, telemetry=None,
                 tracing: bool = False, model_name: str = ""):
        self.engine = engine
        self.pb = pb_utils
        self.metrics = metrics            # EngineMetrics publishing the engine's gauges, or None
        self.telemetry = telemetry        # RequestTelemetry for finished requests, or None
        self.tracing = tracing            # read Triton's span context of each request
        self.model_name = model_name      # the served checkpoint, for the log line and spans
        self._lock = threading.Lock()
        self._inflight: dict[str, _InFlight] = {}
        self._closed = threading.Event()
        self._unhealthy: str | None = None    # why the engine is gone (backend/serving/health.py), or None
        self.watchdog = None
        self._poll_s = cancel_poll_interval_s
        self._watcher = threading.Thread(target=self._watch_cancellations, name="llm-cancel-watch", daemon=True)
        self._watcher.start()

    @classmethod
    def from_model_config(cls, model_config: dict, pb_utils, *, model_version: str = "1") -> "LLMServing":
        """Build the engine from the model's parameters, start it, and publish its metrics."""
        from backend.config import EngineConfig
        from backend.engine.llm_engine import LLMEngine
        from backend.serving.metrics import EngineMetrics

        engine_params, serving = split_parameters(resolve_paths(model_parameters(model_config)))
        poll = positive_float_param(serving, "cancel_poll_interval_s", 0.2)
        interval = positive_float_param(serving, "metrics_interval_s", 1.0)
        log_level = serving["request_log_level"]
        engine = LLMEngine(EngineConfig.from_parameters(engine_params))
        if engine.structured is not None:
            engine.structured.warm_up()    # the grammar layer at load time, not on the first guided request
        engine.start()
        name = model_config.get("name", "llm")
        formats = engine.parts.formats.labels()     # weight / KV / compute formats: /metrics and the log line
        metrics = EngineMetrics(pb_utils, engine.stats, max_num_seqs=engine.config.max_num_seqs,
                                model=name, version=model_version, interval_s=interval, model_info=formats).start()
        telemetry, tracer = build_telemetry(pb_utils, max_model_len=engine.scheduler.max_model_len, model=name,
                                            version=model_version, log_level=log_level, formats=formats)
        log_load_summary(pb_utils, getattr(engine.parts, "summary", ""))
        llm = cls(engine, pb_utils, cancel_poll_interval_s=poll, metrics=metrics, telemetry=telemetry,
                  tracing=tracer is not None, model_name=os.path.basename(os.path.normpath(engine.config.model_path)))
        llm.watch(positive_float_param(serving, "engine_stall_timeout_s", 30.0), serving["engine_unhealthy_action"])
        return llm

    def watch(self, stall_timeout_s: float, action: str = "shutdown") -> None:
        """Start the engine watchdog; ``action`` ``shutdown`` also stops tritonserver when the engine dies."""
        from backend.serving.health import UNHEALTHY_ACTIONS, EngineWatchdog, shutdown_server
        if action not in UNHEALTHY_ACTIONS:
            raise ValueError(f"engine_unhealthy_action: expected one of {UNHEALTHY_ACTIONS}, got {action!r}")

        def on_unhealthy(reason: str) -> None:
            self.engine_unhealthy(reason)
            if action == "shutdown":
                shutdown_server(reason)
        self.watchdog = EngineWatchdog(self.engine, on_unhealthy, stall_timeout_s=stall_timeout_s).start()

    def engine_unhealthy(self, reason: str) -> None:
        """The engine is gone: say why, end every in-flight request with an error, refuse new ones."""
        self._unhealthy = reason
        with self._lock:
            left = list(self._inflight.values())
            self._inflight.clear()
        log.error("llm: engine unhealthy: %s; ending %d in-flight requests with an error", reason, len(left))
        for f in left:
            self._send_error(f.sender, f.engine_id, f"engine unavailable: {reason}")

    # ---- Triton side -----------------------------------------------------------------
    def execute(self, requests) -> None:
        if self._unhealthy is not None:
            for r in requests:
                self._send_error(r.get_response_sender(), r.request_id() or "",
                                 f"engine unavailable: {self._unhealthy}")
            return None
        # Stops first: a stop and its target may arrive in one batch.
        for r in sorted(requests, key=lambda r: not self._is_stop(r)):
            try:
                if self._is_stop(r):
                    self._handle_stop(r)
                else:
                    self._submit(r)
            except Exception as e:  # never leave a stream without a final response
                log.exception("llm: request failed")
                self._send_error(r.get_response_sender(), r.request_id() or "", f"{type(e).__name__}: {e}")
        return None

    def _is_stop(self, r) -> bool:
        t = self.pb.get_input_tensor_by_name(r, wire.STOP)
        return t is not None and bool(np.asarray(t.as_numpy()).reshape(-1)[:1].any())

    def _handle_stop(self, r) -> None:
        target = r.request_id() or ""
        stopped_by = "stop_request"        # a client's stop (TensorRT-LLM's cancel input)
        if self.telemetry is not None:
            reason_t = self.pb.get_input_tensor_by_name(r, wire.REQUEST)
            if reason_t is not None:       # postprocess says why it stops the engine
                stopped_by = wire.parse_stop_reason(np.asarray(reason_t.as_numpy()).reshape(-1)[0]) or stopped_by
        with self._lock:
            if target in self._inflight:
                ids = [target]
            else:
                ids = [f.engine_id for f in self._inflight.values() if target and f.client_id == target]
            for i in ids:
                self._inflight[i].aborted = True
                self._inflight[i].stopped_by, self._inflight[i].stopped_at = stopped_by, time.monotonic()
        for i in ids:
            self.engine.abort(i)
        meta = wire.LLMResponseMeta(request_id=target, finished=True, request_finished=True,
                                    finish_reason="abort", stop_ack=True)
        self._send(r.get_response_sender(), [], None, meta, final=True)

    def _submit(self, r) -> None:
        sender = r.get_response_sender()
        client_id = r.request_id() or ""
        req_t = self.pb.get_input_tensor_by_name(r, wire.REQUEST)
        ids_t = self.pb.get_input_tensor_by_name(r, wire.INPUT_IDS)
        if req_t is None or ids_t is None:
            missing = wire.REQUEST if req_t is None else wire.INPUT_IDS
            return self._send_error(sender, client_id, f"{missing}: required input is missing")
        try:
            raw = np.asarray(req_t.as_numpy()).reshape(-1)
            if raw.size != 1:
                raise ValueError(f"request: expected one JSON string, got {raw.size}")
            llm_req = wire.LLMRequest.from_json(raw[0])
            prompt = np.asarray(ids_t.as_numpy()).reshape(-1).astype(np.int64).tolist()
        except ValueError as e:
            return self._send_error(sender, client_id, str(e))
        engine_id = uuid.uuid4().hex
        flight = _InFlight(engine_id, llm_req.request_id or client_id, r, sender, llm_req.stream, llm_req.options)
        if self.telemetry is not None:
            flight.params, flight.num_prompt_tokens = llm_req.sampling, len(prompt)
            flight.prompt_sha256 = hashlib.sha256(np.asarray(prompt, dtype="<i4").tobytes()).hexdigest()
            if self.tracing:
                flight.trace_context = request_trace_context(r)
        with self._lock:
            self._inflight[engine_id] = flight
        try:
            self.engine.add_request(engine_id, prompt, llm_req.sampling, self._on_output)
        except Exception as e:
            with self._lock:
                self._inflight.pop(engine_id, None)
            msg = engine_error_message(e)
            self._send_error(sender, client_id, msg)
            if self.telemetry is not None:   # a rejected request is a finished one too (log line, error count)
                self.telemetry.submit(self._finished(flight, RequestOutput(
                    engine_id, 0, [], finished=True, request_finished=True, error=msg)))

    # ---- engine side (engine thread) -------------------------------------------------------
    def _on_output(self, out: RequestOutput) -> None:
        with self._lock:
            flight = self._inflight.get(out.request_id)
            if flight is not None and out.request_finished:
                del self._inflight[out.request_id]
        if flight is None:
            return
        try:
            self._respond(flight, out)
        finally:   # after the response: the last token does not wait for the request's telemetry
            if self.telemetry is not None:
                self._note_output(flight, out)

    def _respond(self, flight: _InFlight, out: RequestOutput) -> None:
        reason = out.finish_reason.value if out.finish_reason is not None else None
        meta = wire.LLMResponseMeta(
            request_id=out.request_id, seq_index=out.seq_index, finished=out.finished,
            request_finished=out.request_finished, finish_reason=reason, error=out.error,
            cum_logprob=out.cum_logprob, num_prompt_tokens=out.num_prompt_tokens,
            num_output_tokens=out.num_output_tokens, num_draft_tokens=out.num_draft_tokens,
            num_accepted_draft_tokens=out.num_accepted_draft_tokens)
        if out.seq_index not in flight.seen_seqs:
            flight.seen_seqs.add(out.seq_index)
            meta.options = flight.options
        ids = list(out.new_token_ids)
        lps = [lp.logprob for lp in out.logprobs] if out.logprobs else None
        if not flight.stream:
            if out.request_finished:  # flush sequences that ended without their own `finished` output
                for seq, (p_ids, p_lps, p_opts) in list(flight.pending.items()):
                    if seq != out.seq_index:
                        del flight.pending[seq]
                        self._send(flight.sender, p_ids, p_lps or None, wire.LLMResponseMeta(
                            request_id=out.request_id, seq_index=seq, finished=True, finish_reason=reason,
                            error=out.error, options=p_opts), final=False)
            acc_ids, acc_lps, acc_opts = flight.pending.setdefault(out.seq_index, ([], [], meta.options))
            acc_ids.extend(ids)
            if lps:
                acc_lps.extend(lps)
            if not (out.finished or out.request_finished):
                return
            del flight.pending[out.seq_index]
            ids, lps, meta.options = acc_ids, (acc_lps or None), acc_opts
        self._send(flight.sender, ids, lps, meta, final=out.request_finished)

    # ---- responses ---------------------------------------------------------------------
    def _send(self, sender, ids: list[int], lps: list[float] | None, meta: wire.LLMResponseMeta, final: bool) -> None:
        pb = self.pb
        tensors = [
            pb.Tensor(wire.OUTPUT_IDS, np.array(ids, dtype=np.int32).reshape(1, -1)),
            pb.Tensor(wire.OUTPUT_LOG_PROBS, np.array(lps or (), dtype=np.float32).reshape(1, -1)),
            pb.Tensor(wire.RESPONSE, np.asarray([[meta.to_json().encode()]], dtype=np.object_)),
        ]
        flags = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        try:
            sender.send(pb.InferenceResponse(output_tensors=tensors), flags=flags)
        except Exception as e:  # the client is gone (cancelled) or the response was already completed
            log.debug("llm: could not send a response for %s: %s", meta.request_id, e)

    def _send_error(self, sender, request_id: str, message: str) -> None:
        meta = wire.LLMResponseMeta(request_id=request_id, finished=True, request_finished=True,
                                    finish_reason="error", error=message)
        self._send(sender, [], None, meta, final=True)

    # ---- cancellation and shutdown ------------------------------------------------------
    def _watch_cancellations(self) -> None:
        # is_cancelled() is asked under the lock, and only of requests still in flight: _on_output removes
        # a request under the same lock before sending its final response, after which Triton frees the
        # response factory that is_cancelled() reads (asking then crashed tritonserver). Each call is a round
        # trip to the server, so the lock is taken per request (the output thread, which needs it for every
        # response, never waits for a whole sweep), and a sweep asks at most CANCEL_CHECKS_PER_SWEEP of the
        # requests, those asked longest ago first.
        while not self._closed.wait(self._poll_s):
            self._sweep_cancellations()

    def _sweep_cancellations(self) -> None:
        with self._lock:
            due = sorted((f for f in self._inflight.values() if not f.aborted), key=lambda f: f.cancel_checked_at)
        cancelled = []
        for f in due[:CANCEL_CHECKS_PER_SWEEP]:
            with self._lock:
                if self._inflight.get(f.engine_id) is not f or f.aborted:
                    continue
                f.cancel_checked_at = time.monotonic()
                try:
                    if f.request.is_cancelled():
                        f.aborted, f.stopped_by, f.stopped_at = True, "cancelled", time.monotonic()
                        cancelled.append(f.engine_id)
                except Exception:
                    pass
        for engine_id in cancelled:
            self.engine.abort(engine_id)

    def num_in_flight(self) -> int:
        with self._lock:
            return len(self._inflight)

    def shutdown(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.metrics is not None:
            self.metrics.stop()
        self._closed.set()
        self._watcher.join(timeout=5)
        try:
            self.engine.shutdown()  # ends every request with a final output through _on_output
        finally:
            with self._lock:
                left = list(self._inflight.values())
                self._inflight.clear()
            for f in left:
                self._send_error(f.sender, f.engine_id, "server shutting down")
            if self.telemetry is not None:
                self.telemetry.shutdown()

    # ---- telemetry ---------------------------------------------------------------------
    def _note_output(self, flight: _InFlight, out: RequestOutput) -> None:
        """Hash the tokens (engine thread); on the request's last output, hand it to telemetry."""
        h = flight.output_hashes.get(out.seq_index)
        if h is None:
            h = flight.output_hashes[out.seq_index] = hashlib.sha256()
        if out.new_token_ids:
            h.update(np.asarray(out.new_token_ids, dtype="<i4").tobytes())
        if out.finished and out.finish_reason is not None:
            flight.finish_reasons[out.seq_index] = out.finish_reason.value
        if out.request_finished:
            self.telemetry.submit(self._finished(flight, out))

    def _finished(self, flight: _InFlight, out: RequestOutput) -> FinishedRequest:
        # an abort the engine reports for a stop by postprocess is what the client sees instead
        seen_as = {"stop_string": "stop", "error": "error"}.get(flight.stopped_by or "", "abort")
        reason = out.finish_reason.value if out.finish_reason is not None else "error"
        reason = seen_as if reason == "abort" else reason
        reasons = [flight.finish_reasons.get(i, reason) for i in sorted(flight.output_hashes)]
        reasons = [seen_as if r == "abort" else r for r in reasons]
        return FinishedRequest(
            model_name=self.model_name, engine_id=flight.engine_id, client_id=flight.client_id,
            params=flight.params, stats=out.stats, finish_reason=reason, finish_reasons=reasons,
            stopped_by=flight.stopped_by, stopped_at=flight.stopped_at, error=out.error,
            prompt_sha256=flight.prompt_sha256,
            num_prompt_tokens=flight.num_prompt_tokens,
            output_sha256=[flight.output_hashes[i].hexdigest() for i in sorted(flight.output_hashes)],
            options=flight.options, trace_context=flight.trace_context, finished_wall=time.time(),
            wall_offset=monotonic_offset())


def build_telemetry(pb_utils, *, max_model_len: int, model: str, version: str, log_level: str = "info",
                    formats: dict[str, str] | None = None):
    """(RequestTelemetry started, ModelTracer or None): histograms, the request log, and spans when the
    OTEL_* environment turns tracing on."""
    from backend.serving.request_log import RequestLog
    from backend.serving.request_metrics import RequestMetrics
    from backend.serving.telemetry import RequestTelemetry
    from tracing import ModelTracer

    metrics = RequestMetrics(pb_utils, max_model_len=max_model_len, model=model, version=version)
    request_log = RequestLog(log_level, formats=formats)

    def record_metrics(rec: FinishedRequest) -> None:
        metrics.record(rec.stats, rec.finish_reason)
    sinks = [record_metrics, request_log.write]
    tracer = ModelTracer.from_env(model)
    if tracer is not None:
        from backend.serving.tracing import LLMSpans

        sinks.append(LLMSpans(tracer))
    closers = [tracer.shutdown] if tracer is not None else []
    # the metric families must live as long as the telemetry that observes them
    telemetry = RequestTelemetry(sinks, closers=closers, periodic=[metrics.publish],
                                 resources=(metrics, request_log, tracer)).start()
    return telemetry, tracer


def log_load_summary(pb_utils, summary: str) -> None:
    """The engine's one load line (backend/engine/builder.py), in Triton's log when it has a logger."""
    if not summary:
        return
    logger = getattr(pb_utils, "Logger", None)
    if logger is not None:
        logger.log_info(summary)
    else:
        log.warning(summary)


def engine_error_message(e: Exception) -> str:
    """``"n: 65 parallel samples ..."`` -> ``"num_return_sequences: 65 parallel samples ..."``."""
    if not isinstance(e, ValueError):
        return f"engine unavailable: {type(e).__name__}: {e}"
    return as_ensemble_error(str(e))
