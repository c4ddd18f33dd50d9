"""The ``postprocess`` Triton model's glue: one llm response in, one ensemble response out.

For each request (one llm response): read ``output_ids``, ``output_log_probs`` and the ``response``
meta JSON, call ``Postprocessor.process``, and build TensorRT-LLM's output tensors. Then:
- a stop string matched (``stop_engine``): send the llm a BLS ``stop`` request for the engine's
  request id, so it frees the sequence at once; later tokens of it come back as empty deltas;
- the request was cancelled (the client went away; Triton 2.51's ensemble marks the *next* step's
  requests cancelled, never the llm's in-flight one): stop the engine the same way;
- ``meta.error``: on the request's final response, drop the state and answer a ``TritonError``
  (an error of one sequence of several is held until then).

Errors reach the client only on a stream's final response. On Triton 2.51 an ensemble whose
step fails while another step is still in flight never completes, so a failure in the middle of
a stream stops the engine and is reported when its final response arrives.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict

import numpy as np

from contracts import wire
from contracts.triton_config import (
    DEFAULT_TOKENIZER,
    check_known_parameters,
    int_param,
    model_parameters,
    positive_float_param,
    resolve_path,
    str_param,
)
from postprocess.processor import Postprocessor
from postprocess.top_logprobs import top_logprobs_json
from tracing import TracedServing

log = logging.getLogger(__name__)
LLM_MODEL = "llm"
MAX_CANCEL_INTERVAL_S = 1.0   # however many streams, each is asked at least this often
GUIDED_INVALID_METRIC = "triton_llm_guided_output_invalid_total"   # finished guided outputs failing their guide
# every parameter the postprocess model reads; any other fails its load
POSTPROCESS_PARAMETERS = frozenset({"tokenizer_path", "max_states", "llm_model", "cancel_checks_per_s"})


class PostprocessServing(TracedServing):
    def __init__(self, processor: Postprocessor, pb_utils, *, llm_model: str = LLM_MODEL, max_remembered: int = 4096,
                 cancel_check_interval_s: float = 0.05, cancel_checks_per_s: float = 50.0, clock=time.monotonic,
                 tracer=None):
        if not cancel_checks_per_s > 0:
            raise ValueError(f"cancel_checks_per_s: expected a number > 0, got {cancel_checks_per_s!r}")
        self.processor = processor
        self.pb = pb_utils
        self.last_meta: wire.LLMResponseMeta | None = None   # of the response being processed (for tracing)
        self.tracing = None   # PostprocessTracing when OTEL_* turns tracing on (tracing/)
        if tracer is not None:
            from postprocess.tracing import PostprocessTracing

            self.tracing = PostprocessTracing(tracer, self, max_requests=max_remembered)
        self.llm_model = llm_model
        self._stopped: OrderedDict[str, None] = OrderedDict()  # engine ids already sent a stop
        self._failed: dict[str, str] = {}                      # engine id -> error to report on its final response
        self._max_remembered = max_remembered
        self._cancel_checked: OrderedDict[str, float] = OrderedDict()  # engine id -> last is_cancelled() call
        self._cancel_interval = cancel_check_interval_s
        self._cancel_rate = cancel_checks_per_s
        self._clock = clock
        family = getattr(pb_utils, "MetricFamily", None)   # kept alive with the metric (Triton's rule)
        self._invalid_family = family and family(name=GUIDED_INVALID_METRIC, kind=family.COUNTER, description=(
            "Guided outputs that finished but failed their guide's check (a bug: each one is an error)"))
        self._invalid_guided = self._invalid_family.Metric(labels={"model": "postprocess"}) if family else None

    def close(self) -> None:
        """Release the metric, then its family (the model's finalize: at interpreter teardown a family's
        destructor would reach the stub's shared memory after the stub released it)."""
        self._invalid_guided = None
        self._invalid_family = None

    @classmethod
    def from_model_config(cls, model_config: dict, pb_utils) -> "PostprocessServing":
        params = model_parameters(model_config)
        check_known_parameters(model_config.get("name", "postprocess"), params, POSTPROCESS_PARAMETERS)
        import grammar  # noqa: F401 (xgrammar, for the guided-output check: loaded at start-up)
        from preprocess.tokenizer import load_tokenizer

        path = resolve_path(str_param(params, "tokenizer_path", DEFAULT_TOKENIZER))
        max_states = int_param(params, "max_states", 4096)
        from tracing import ModelTracer

        return cls(Postprocessor(load_tokenizer(path), max_requests=max_states), pb_utils,
                   llm_model=str_param(params, "llm_model", LLM_MODEL),
                   cancel_checks_per_s=positive_float_param(params, "cancel_checks_per_s", 50.0),
                   tracer=ModelTracer.from_env(model_config.get("name", "postprocess")))

    def _process(self, request):
        pb = self.pb
        self.last_meta = None
        try:
            raw = pb.get_input_tensor_by_name(request, wire.RESPONSE).as_numpy().reshape(-1)[0]
            meta = self.last_meta = wire.LLMResponseMeta.from_json(raw)
        except Exception as e:
            log.exception("postprocess: unreadable llm response")
            return pb.InferenceResponse(error=pb.TritonError(f"postprocess: unreadable llm response: {e}"))
        rid = meta.request_id
        if meta.stop_ack:  # the answer to a client's `stop` request: nothing to detokenize
            return self._response("", "", meta, [], 0, 0)
        if self._should_check_cancel(rid, meta.request_finished) and request.is_cancelled():
            self.stop_engine(rid, "cancelled")
        if meta.error and not meta.request_finished:  # one sequence of several failed: report at the end
            self._failed.setdefault(rid, meta.error)
        if meta.error and meta.request_finished:
            self.processor.drop(rid)
            self._failed.pop(rid, None)
            return pb.InferenceResponse(error=pb.TritonError(meta.error))
        if rid in self._failed:
            if meta.request_finished:
                self.processor.drop(rid)
                return pb.InferenceResponse(error=pb.TritonError(self._failed.pop(rid)))
            return self._response("", "", meta, [], 0, 0)
        try:
            ids = pb.get_input_tensor_by_name(request, wire.OUTPUT_IDS).as_numpy().reshape(-1).tolist()
            out = self.processor.process(rid, ids, is_final=meta.finished or meta.request_finished,
                                         finish_reason=meta.finish_reason, options_json=meta.options,
                                         seq_index=meta.seq_index)
            if out.stop_engine:
                self.stop_engine(rid, "stop_string")
            if out.error:  # a guided output that finished but fails its guide: a bug, never passed on
                log.error("postprocess: request %s: %s", rid, out.error)
                if self._invalid_guided is not None:
                    self._invalid_guided.increment(1)
                if meta.request_finished:
                    return pb.InferenceResponse(error=pb.TritonError(out.error))
                self._failed[rid] = out.error
                return self._response("", "", meta, [], 0, 0)
            lps: list[float] = []
            tops = ""
            if out.options.return_log_probs:
                t = pb.get_input_tensor_by_name(request, wire.OUTPUT_LOG_PROBS)
                lps = t.as_numpy().reshape(-1)[: out.num_accepted_tokens].tolist() if t is not None else []
                if meta.top_logprobs:
                    tops = top_logprobs_json(self.processor.tokenizer, meta.top_logprobs[: out.num_accepted_tokens])
            return self._response(out.text, out.finish_reason or "", meta, lps, out.num_input_tokens,
                                  out.num_output_tokens, perf=out.options.return_perf_metrics, tops=tops)
        except Exception as e:
            log.exception("postprocess failed for %s", rid)
            message = f"postprocess: internal error: {type(e).__name__}: {e}"
            self.processor.drop(rid)
            if meta.request_finished:
                return pb.InferenceResponse(error=pb.TritonError(message))
            self._failed[rid] = message  # reported on the final response (see the module doc)
            self.stop_engine(rid, "error")
            return self._response("", "", meta, [], 0, 0)

    def _should_check_cancel(self, engine_id: str, last: bool) -> bool:
        """Whether to ask ``is_cancelled()`` now. It is a round trip to the server that blocks this (single)
        instance, so it is rationed: a request is asked once ``cancel_check_interval_s`` have passed since
        its first response or its last check, and all requests together about ``cancel_checks_per_s``
        times a second (with many streams each is asked less often, but at least every
        ``MAX_CANCEL_INTERVAL_S``). Never on a request's final response: the engine is done with it, so
        there is nothing left to stop, and the last token would wait for the answer."""
        now = self._clock()
        if last:
            self._cancel_checked.pop(engine_id, None)
            return False
        previous = self._cancel_checked.get(engine_id)
        if previous is not None:
            rationed = min(len(self._cancel_checked) / self._cancel_rate, MAX_CANCEL_INTERVAL_S)
            if now - previous < max(self._cancel_interval, rationed):
                return False
        self._cancel_checked[engine_id] = now
        self._cancel_checked.move_to_end(engine_id)
        while len(self._cancel_checked) > self._max_remembered:
            self._cancel_checked.popitem(last=False)
        return previous is not None

    def stop_engine(self, engine_id: str, reason: str = "stop_string") -> None:
        """BLS ``stop`` to the llm model (decoupled): it answers at once with a final response.
        ``reason`` (``wire.STOP_REASONS``) goes along for the llm's request log and metrics."""
        if engine_id in self._stopped:
            return
        self._stopped[engine_id] = None
        while len(self._stopped) > self._max_remembered:
            self._stopped.popitem(last=False)
        pb = self.pb
        req = pb.InferenceRequest(model_name=self.llm_model, request_id=engine_id,
                                  inputs=[pb.Tensor(wire.STOP, np.asarray([[True]], dtype=np.bool_)),
                                          pb.Tensor(wire.REQUEST, np.asarray(
                                              [[wire.stop_reason_json(reason).encode()]], dtype=np.object_))],
                                  requested_output_names=[wire.RESPONSE])
        start = time.time_ns()
        try:
            for resp in req.exec(decoupled=True):
                if resp is not None and resp.has_error():
                    log.warning("postprocess: stop of %s failed: %s", engine_id, resp.error().message())
        except Exception:
            log.exception("postprocess: stop of %s failed", engine_id)
        if self.tracing is not None:
            self.tracing.engine_stop_sent(engine_id, reason, start)

    def _response(self, text: str, reason: str, meta: wire.LLMResponseMeta, lps: list[float],
                  num_input: int, num_output: int, perf: bool = False, tops: str = ""):
        """TensorRT-LLM's output tensors; the speculative counts (cumulative for the sequence) only when
        the request set ``return_perf_metrics``, zeros otherwise; ``top_log_probs`` (ours) when the
        request asked for ``top_logprobs``, empty otherwise."""
        pb = self.pb
        cum = meta.cum_logprob if meta.cum_logprob is not None else 0.0
        drafts = meta.num_draft_tokens if perf else 0
        accepted = meta.num_accepted_draft_tokens if perf else 0
        return pb.InferenceResponse(output_tensors=[
            pb.Tensor("text_output", np.asarray([[text.encode("utf-8")]], dtype=np.object_)),
            pb.Tensor("finish_reason", np.asarray([[reason.encode()]], dtype=np.object_)),
            pb.Tensor("cum_log_probs", np.asarray([[cum]], dtype=np.float32)),
            pb.Tensor("output_log_probs", np.asarray([lps], dtype=np.float32).reshape(1, -1)),
            pb.Tensor("num_input_tokens", np.asarray([[num_input]], dtype=np.int32)),
            pb.Tensor("num_output_tokens", np.asarray([[num_output]], dtype=np.int32)),
            pb.Tensor("sequence_index", np.asarray([[meta.seq_index]], dtype=np.int32)),
            pb.Tensor("acceptance_rate", np.asarray([[accepted / drafts if drafts else 0.0]], dtype=np.float32)),
            pb.Tensor("total_accepted_draft_tokens", np.asarray([[accepted]], dtype=np.int32)),
            pb.Tensor("total_draft_tokens", np.asarray([[drafts]], dtype=np.int32)),
            pb.Tensor("top_log_probs", np.asarray([[tops.encode()]], dtype=np.object_)),
        ])
