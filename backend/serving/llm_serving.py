"""The ``llm`` Triton model's logic: requests in, engine outputs out as decoupled responses.

``execute()`` only submits: every request is handed to the engine with its response sender and
``execute`` returns. Responses are sent from the engine thread's ``on_output`` callback. Rules:
- a request whose ``stop`` input is true aborts the request it names (by Triton request id: the
  engine's id, which postprocess uses, or the client's id) and gets its own final response at once,
  never waiting on the engine loop;
- a watcher thread polls ``is_cancelled()`` of in-flight requests and aborts the cancelled ones
  (backend/serving/cancel_watch.py);
- every stream ends with a response flagged ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``, whatever
  happens: a failed request ends with ``meta.error`` set (postprocess turns it into a ``TritonError``
  naming the field, and drops its state for the request); responses: backend/serving/responses.py;
- each finished request goes to ``telemetry`` (histograms, the JSON log line, spans when traced:
  backend/serving/telemetry.py), which runs on its own thread.
- a watchdog (``backend/serving/health.py``) declares the engine unhealthy when its loop dies or stalls
  with work waiting: every in-flight request then ends with an error, new ones are refused, and by
  default tritonserver is asked to shut down so that its readiness tells the truth.

``shutdown()`` ends every request and then releases the model's metric objects, so that the model's
``finalize()`` leaves none to interpreter teardown. ``pb_utils`` (Triton's ``triton_python_backend_utils``)
is passed in, so this module runs in tests without the server; backend/serving/llm_startup.py builds it
from the model's configuration.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid

import numpy as np

from backend.core.outputs import RequestOutput
from backend.engine.inbox import queue_full_error
from backend.serving.cancel_watch import CancelWatcher
from backend.serving.health import UNHEALTHY_ACTIONS, EngineWatchdog, shutdown_server
from backend.serving.inflight import InFlight, finished_request, prompt_digest
from backend.serving.lora_inputs import lora_task_name
from backend.serving.responses import engine_error_message, respond, send, send_error
from contracts import wire
from tracing import request_trace_context

log = logging.getLogger(__name__)


class LLMServing:
    """Owns the in-flight table between Triton's requests and the engine's callbacks."""

    def __init__(self, engine, pb_utils, *, cancel_poll_interval_s: float = 0.2, metrics=None, telemetry=None,
                 tracing: bool = False, model_name: str = "", queue_cap: tuple[int, int] | None = None):
        self.engine = engine
        self.pb = pb_utils
        self.metrics = metrics            # EngineMetrics publishing the engine's gauges, or None
        self.telemetry = telemetry        # RequestTelemetry for finished requests, or None
        self.tracing = tracing            # read Triton's span context of each request
        self.model_name = model_name      # the served checkpoint, for the log line and spans
        self.queue_cap = queue_cap        # (max_num_seqs, max_queued_requests): refuse past their sum; None: none
        self._lock = threading.Lock()
        self._inflight: dict[str, InFlight] = {}
        self._unhealthy: str | None = None    # why the engine is gone (backend/serving/health.py), or None
        self.watchdog = None
        self._watcher = CancelWatcher(self._lock, self._inflight, lambda i: self.engine.abort(i), cancel_poll_interval_s)

    def watch(self, stall_timeout_s: float, action: str = "shutdown") -> None:
        """Start the engine watchdog; ``action`` ``shutdown`` also stops tritonserver when the engine dies."""
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
                f = self._inflight[i]
                if not f.aborted:          # the first stop is the one the log line and the span report
                    f.stopped_by, f.stopped_at = stopped_by, time.monotonic()
                f.aborted = True
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
            task = lora_task_name(self.pb, r, self.engine)    # TensorRT-LLM's LoRA tensors
            if task is not None:
                if llm_req.sampling.lora_name not in (None, task):
                    raise ValueError("lora_task_id: not with lora_name (name one adapter)")
                llm_req.sampling = dataclasses.replace(llm_req.sampling, lora_name=task)
        except ValueError as e:
            return self._send_error(sender, client_id, str(e))
        engine_id = uuid.uuid4().hex
        flight = InFlight(engine_id, llm_req.request_id or client_id, r, sender, llm_req.stream, llm_req.options)
        if self.telemetry is not None:
            flight.params, flight.num_prompt_tokens = llm_req.sampling, len(prompt)
            flight.prompt_sha256 = prompt_digest(prompt)
            if self.tracing:
                flight.trace_context = request_trace_context(r)
        with self._lock:
            full = None if self.queue_cap is None else queue_full_error(len(self._inflight), *self.queue_cap)
            if full is None:
                self._inflight[engine_id] = flight
        if full is not None:
            return self._refuse(flight, full)
        try:
            self.engine.add_request(engine_id, prompt, llm_req.sampling, self._on_output)
        except Exception as e:
            with self._lock:
                self._inflight.pop(engine_id, None)
            self._refuse(flight, engine_error_message(e))

    def _refuse(self, flight: InFlight, msg: str) -> None:
        """End a request the engine did not take with an error naming why."""
        self._send_error(flight.sender, flight.request.request_id() or "", msg)
        if self.telemetry is not None:   # a rejected request is a finished one too (log line, error count)
            self.telemetry.submit(finished_request(flight, RequestOutput(
                flight.engine_id, 0, [], finished=True, request_finished=True, error=msg), self.model_name))

    # ---- engine side (engine thread) -------------------------------------------------------
    def _on_output(self, out: RequestOutput) -> None:
        with self._lock:
            flight = self._inflight.get(out.request_id)
            if flight is not None and out.request_finished:
                del self._inflight[out.request_id]
        if flight is None:
            return
        try:
            respond(self.pb, flight, out)
        finally:   # after the response: the last token does not wait for the request's telemetry
            if self.telemetry is not None:
                self._note_output(flight, out)

    def _send(self, sender, ids: list[int], lps: list[float] | None, meta: wire.LLMResponseMeta, final: bool) -> None:
        send(self.pb, sender, ids, lps, meta, final)

    def _send_error(self, sender, request_id: str, message: str) -> None:
        send_error(self.pb, sender, request_id, message)

    # ---- cancellation and shutdown ------------------------------------------------------
    def _sweep_cancellations(self) -> None:
        self._watcher.sweep()

    def num_in_flight(self) -> int:
        with self._lock:
            return len(self._inflight)

    def shutdown(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.metrics is not None:
            self.metrics.stop()
        self._watcher.stop()
        try:
            self.engine.shutdown()  # ends every request with a final output through _on_output
        finally:
            with self._lock:
                left = list(self._inflight.values())
                self._inflight.clear()
            for f in left:
                self._send_error(f.sender, f.engine_id, "server shutting down")
            if self.telemetry is not None:
                self.telemetry.shutdown()   # flushes, then releases the request histograms
            if self.metrics is not None:
                self.metrics.close()        # the engine gauges, while Triton's stub still serves them

    # ---- telemetry ---------------------------------------------------------------------
    def _note_output(self, flight: InFlight, out: RequestOutput) -> None:
        """Hash the tokens (engine thread); on the request's last output, hand it to telemetry."""
        flight.note_output(out)
        if out.request_finished:
            self.telemetry.submit(finished_request(flight, out, self.model_name))
