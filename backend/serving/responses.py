"""The ``llm`` model's decoupled responses: output ids, logprobs and the ``response`` meta JSON.

A streamed request gets one response per engine output. A non-streamed one gets one response per
sequence, its outputs held (``InFlight.pending``) until the sequence ends; the request's final output
flushes the sequences that ended without their own ``finished`` output. Only the request's last response
carries ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``.
"""
from __future__ import annotations

import logging

import numpy as np

from backend.core.outputs import RequestOutput
from backend.serving.inflight import InFlight
from contracts import wire
from contracts.field_names import as_ensemble_error

log = logging.getLogger(__name__)


def send(pb, sender, ids: list[int], lps: list[float] | None, meta: wire.LLMResponseMeta, final: bool) -> None:
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


def send_error(pb, sender, request_id: str, message: str) -> None:
    """A final response with ``meta.error`` set (postprocess turns it into a ``TritonError``)."""
    meta = wire.LLMResponseMeta(request_id=request_id, finished=True, request_finished=True,
                                finish_reason="error", error=message)
    send(pb, sender, [], None, meta, final=True)


def respond(pb, flight: InFlight, out: RequestOutput) -> None:
    """Send what ``out`` adds to the request's responses (nothing while a non-streamed sequence runs)."""
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
    tops = top_alternatives(out)
    if not flight.stream:
        if out.request_finished:  # flush sequences that ended without their own `finished` output
            for seq, (p_ids, p_lps, p_tops, p_opts) in list(flight.pending.items()):
                if seq != out.seq_index:
                    del flight.pending[seq]
                    send(pb, flight.sender, p_ids, p_lps or None, wire.LLMResponseMeta(
                        request_id=out.request_id, seq_index=seq, finished=True, finish_reason=reason,
                        error=out.error, options=p_opts, top_logprobs=p_tops or None), final=False)
        acc_ids, acc_lps, acc_tops, acc_opts = flight.pending.setdefault(out.seq_index, ([], [], [], meta.options))
        acc_ids.extend(ids)
        if lps:
            acc_lps.extend(lps)
        if tops:
            acc_tops.extend(tops)
        if not (out.finished or out.request_finished):
            return
        del flight.pending[out.seq_index]
        ids, lps, tops, meta.options = acc_ids, (acc_lps or None), acc_tops, acc_opts
    meta.top_logprobs = tops or None
    send(pb, flight.sender, ids, lps, meta, final=out.request_finished)


def top_alternatives(out: RequestOutput) -> list[list[list[float]]] | None:
    """Per new token, its ``[token id, logprob]`` alternatives (``None`` when no token has any)."""
    if not out.logprobs or not any(lp.top for lp in out.logprobs):
        return None
    return [[[tid, lp] for tid, lp in t.top] for t in out.logprobs]


def engine_error_message(e: Exception) -> str:
    """``"n: 65 parallel samples ..."`` -> ``"num_return_sequences: 65 parallel samples ..."``."""
    if not isinstance(e, ValueError):
        return f"engine unavailable: {type(e).__name__}: {e}"
    return as_ensemble_error(str(e))
