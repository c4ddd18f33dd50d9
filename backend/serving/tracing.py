"""The llm model's spans for one finished request, made after the fact from its ``RequestStats``.

Under Triton's ``llm`` span (from ``request.trace().get_context()`` at submission):

    llm.generate     arrival at the engine -> the request's end      GenAI request/usage attributes;
                                                                     events: first_token, preempted, stop_requested
      llm.queue      arrival -> first scheduled
      llm.prefill    first scheduled -> first token                   events: prefill_chunk (tokens, seconds)
      llm.decode     first token -> end                               output tokens, decode steps, preemptions;
                                                                      events: preempted, recompute_chunk

Triton 2.51 ends a decoupled model's span when ``execute`` returns (the request is only handed to
the engine there), so ``llm.generate`` outlives its parent: it is the asynchronous continuation of
that call and lies within the ensemble's span. Attribute names follow the OpenTelemetry GenAI
semantic conventions where one exists, ``triton_llm.*`` otherwise.
"""
from __future__ import annotations

from typing import Any

from backend.serving.telemetry import FinishedRequest, f32
import tracing as t
from tracing import ModelTracer, unix_nanos


def _stop_sequences(options: dict[str, Any] | None) -> list[str] | None:
    stop = (options or {}).get("stop")
    return list(stop) if isinstance(stop, list) and stop else None


def generate_attributes(rec: FinishedRequest) -> dict[str, Any]:
    p, s = rec.params, rec.stats
    attrs: dict[str, Any] = {
        t.GEN_AI_OPERATION_NAME: "text_completion",
        t.GEN_AI_REQUEST_MODEL: rec.model_name,
        t.GEN_AI_REQUEST_MAX_TOKENS: p.max_tokens,
        t.GEN_AI_REQUEST_TEMPERATURE: f32(p.temperature),
        t.GEN_AI_REQUEST_TOP_P: f32(p.top_p),
        t.GEN_AI_REQUEST_TOP_K: p.top_k,
        t.GEN_AI_REQUEST_FREQUENCY_PENALTY: f32(p.frequency_penalty),
        t.GEN_AI_REQUEST_PRESENCE_PENALTY: f32(p.presence_penalty),
        t.GEN_AI_REQUEST_SEED: s.seed if s is not None else p.seed,
        t.GEN_AI_REQUEST_CHOICE_COUNT: p.n,
        t.GEN_AI_REQUEST_STOP_SEQUENCES: _stop_sequences(rec.output_options),
        t.GEN_AI_RESPONSE_ID: rec.engine_id,
        t.GEN_AI_RESPONSE_FINISH_REASONS: list(rec.finish_reasons) or [rec.finish_reason],
        t.ATTR_PREFIX + "request_id": rec.client_id,
        t.ATTR_PREFIX + "prompt_sha256": rec.prompt_sha256,
        t.ATTR_PREFIX + "request.min_p": f32(p.min_p),
        t.ATTR_PREFIX + "request.repetition_penalty": f32(p.repetition_penalty),
        t.ATTR_PREFIX + "request.seed_drawn": p.seed is None and s is not None and s.seed is not None,
        t.ATTR_PREFIX + "stopped_by": rec.stopped_by,
        t.ATTR_PREFIX + "error": rec.error,
    }
    if p.guide is not None:
        attrs[t.ATTR_PREFIX + "request.guide_type"] = p.guide.kind
    if p.lora_name is not None:
        attrs[t.ATTR_PREFIX + "request.lora_name"] = p.lora_name
    if s is not None:
        attrs.update({
            t.GEN_AI_USAGE_INPUT_TOKENS: s.num_prompt_tokens,
            t.GEN_AI_USAGE_OUTPUT_TOKENS: s.num_output_tokens,
            t.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: s.num_cached_tokens,
            t.ATTR_PREFIX + "queue_time_s": s.queue_time,
            t.ATTR_PREFIX + "time_to_first_token_s": s.time_to_first_token,
            t.ATTR_PREFIX + "time_per_output_token_s": s.time_per_output_token,
            t.ATTR_PREFIX + "preemptions": s.num_preemptions,
        })
    return attrs


class LLMSpans:
    """Telemetry sink: the llm spans of a traced request (nothing for an untraced one)."""

    __name__ = "llm spans"

    def __init__(self, tracer: ModelTracer):
        self.tracer = tracer

    def __call__(self, rec: FinishedRequest) -> None:
        s = rec.stats
        parent = self.tracer.parent(rec.trace_context)
        if parent is None or s is None:
            return
        ns = lambda mono: unix_nanos(mono, rec.wall_offset)  # noqa: E731
        start, end = ns(s.arrival_time), ns(s.finished_time)
        events = []
        if s.first_token_time is not None:
            events.append(("first_token", ns(s.first_token_time), {}))
        events += [("preempted", ns(x), {}) for x in s.preemption_times]
        if rec.stopped_by:
            at = ns(rec.stopped_at) if rec.stopped_at is not None else end
            events.append(("stop_requested", min(at, end), {t.ATTR_PREFIX + "stopped_by": rec.stopped_by}))
        ctx = self.tracer.span("llm.generate", parent, start, end, generate_attributes(rec), events, error=rec.error)

        scheduled = s.first_scheduled_time
        self.tracer.span("llm.queue", ctx, start, ns(scheduled if scheduled is not None else s.finished_time),
                         {t.ATTR_PREFIX + "scheduled": scheduled is not None})
        if scheduled is None:
            return
        first = s.first_token_time
        chunks = [("prefill_chunk", ns(c_end), {t.ATTR_PREFIX + "chunk.tokens": tokens,
                                                t.ATTR_PREFIX + "chunk.seconds": round(c_end - c_start, 6)})
                  for c_start, c_end, tokens in s.prefill_chunks if first is None or c_start < first]
        self.tracer.span("llm.prefill", ctx, ns(scheduled), ns(first if first is not None else s.finished_time), {
            t.GEN_AI_USAGE_INPUT_TOKENS: s.num_prompt_tokens,
            t.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: s.num_cached_tokens,
            t.ATTR_PREFIX + "prefill_chunks": s.num_prefill_chunks,
        }, chunks)
        if first is None:
            return
        self.tracer.span("llm.decode", ctx, ns(first), end, {
            t.GEN_AI_USAGE_OUTPUT_TOKENS: s.num_output_tokens,
            t.ATTR_PREFIX + "decode_steps": s.num_decode_steps,
            t.ATTR_PREFIX + "preemptions": s.num_preemptions,
            t.ATTR_PREFIX + "time_per_output_token_s": s.time_per_output_token,
        }, [("preempted", ns(x), {}) for x in s.preemption_times if x >= first] +
            [("recompute_chunk", ns(c_end), {t.ATTR_PREFIX + "chunk.tokens": tokens})
             for c_start, c_end, tokens in s.prefill_chunks if c_start >= first])
