"""The ``llm`` Triton model's logic: requests in, engine outputs out as decoupled responses.

``execute()`` only submits: every request is handed to the engine with its response sender and
``execute`` returns. Responses are sent from the engine thread's ``on_output`` callback. Rules:
- a request whose ``stop`` input is true aborts the request it names (by Triton request id: the
  engine's id, which postprocess uses, or the client's id) and gets its own final response at once,
  never waiting on the engine loop;
- a watcher thread polls ``is_cancelled()`` of in-flight requests and aborts the cancelled ones;
- every stream ends with a response flagged ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``, whatever
  happens: a failed request ends with ``meta.error`` set (postprocess turns it into a ``TritonError``
  naming the field, and drops its state for the request).

``pb_utils`` (Triton's ``triton_python_backend_utils``) is passed in, so this module runs in tests
without the server.
"""
from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from backend.core.outputs import RequestOutput
from contracts import wire
from contracts.field_names import as_ensemble_error
from contracts.triton_config import (
    model_parameters,
    positive_float_param,
    resolve_paths,
)

log = logging.getLogger(__name__)

# config.pbtxt parameters read by this module (the others go to EngineConfig.from_parameters).
SERVING_PARAMETERS = {"cancel_poll_interval_s": "0.2", "metrics_interval_s": "1.0"}


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


class LLMServing:
    """Owns the in-flight table between Triton's requests and the engine's callbacks."""

    def __init__(self, engine, pb_utils, *, cancel_poll_interval_s: float = 0.2, metrics=None):
        self.engine = engine
        self.pb = pb_utils
        self.metrics = metrics            # EngineMetrics publishing the engine's gauges, or None
        self._lock = threading.Lock()
        self._inflight: dict[str, _InFlight] = {}
        self._closed = threading.Event()
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
        engine = LLMEngine(EngineConfig.from_parameters(engine_params))
        if engine.structured is not None:
            engine.structured.warm_up()    # the grammar layer at load time, not on the first guided request
        engine.start()
        metrics = EngineMetrics(pb_utils, engine.stats, max_num_seqs=engine.config.max_num_seqs,
                                model=model_config.get("name", "llm"), version=model_version,
                                interval_s=interval).start()
        return cls(engine, pb_utils, cancel_poll_interval_s=poll, metrics=metrics)

    # ---- Triton side -----------------------------------------------------------------
    def execute(self, requests) -> None:
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
        with self._lock:
            if target in self._inflight:
                ids = [target]
            else:
                ids = [f.engine_id for f in self._inflight.values() if target and f.client_id == target]
            for i in ids:
                self._inflight[i].aborted = True
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
        with self._lock:
            self._inflight[engine_id] = flight
        try:
            self.engine.add_request(engine_id, prompt, llm_req.sampling, self._on_output)
        except Exception as e:
            with self._lock:
                self._inflight.pop(engine_id, None)
            msg = engine_error_message(e)
            self._send_error(sender, client_id, msg)

    # ---- engine side (engine thread) -------------------------------------------------------
    def _on_output(self, out: RequestOutput) -> None:
        with self._lock:
            flight = self._inflight.get(out.request_id)
            if flight is not None and out.request_finished:
                del self._inflight[out.request_id]
        if flight is None:
            return
        reason = out.finish_reason.value if out.finish_reason is not None else None
        meta = wire.LLMResponseMeta(
            request_id=out.request_id, seq_index=out.seq_index, finished=out.finished,
            request_finished=out.request_finished, finish_reason=reason, error=out.error,
            cum_logprob=out.cum_logprob, num_prompt_tokens=out.num_prompt_tokens,
            num_output_tokens=out.num_output_tokens)
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
            pb.Tensor(wire.OUTPUT_IDS, np.asarray([ids], dtype=np.int32).reshape(1, -1)),
            pb.Tensor(wire.OUTPUT_LOG_PROBS, np.asarray([lps or []], dtype=np.float32).reshape(1, -1)),
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
        # response factory that is_cancelled() reads (asking then crashed tritonserver).
        while not self._closed.wait(self._poll_s):
            cancelled = []
            with self._lock:
                for f in self._inflight.values():
                    if f.aborted:
                        continue
                    try:
                        if f.request.is_cancelled():
                            f.aborted = True
                            cancelled.append(f.engine_id)
                    except Exception:
                        pass
            for engine_id in cancelled:
                self.engine.abort(engine_id)

    def num_in_flight(self) -> int:
        with self._lock:
            return len(self._inflight)

    def shutdown(self) -> None:
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


def engine_error_message(e: Exception) -> str:
    """``"n: 65 parallel samples ..."`` -> ``"num_return_sequences: 65 parallel samples ..."``."""
    if not isinstance(e, ValueError):
        return f"engine unavailable: {type(e).__name__}: {e}"
    return as_ensemble_error(str(e))
