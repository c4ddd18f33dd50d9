"""What the postprocess adapter calls for every response the engine streams.

``Postprocessor.process`` turns one response's new token ids into a ``text_output`` delta, a
finish reason, and the signal to stop the engine when a stop string matched first. Per-request
state (detokenizer, stop matcher, options) lives in a bounded table and is dropped on the
request's final response.

Semantics:
- Stop strings match at text level. On a match the delta ends at the stop (or includes it when
  ``include_stop_str_in_output``), ``finish_reason`` is ``"stop"``, and ``stop_engine`` is set once
  (for ``n > 1``: when every sequence of the request is finished). Later tokens of that sequence
  produce empty deltas; the engine's own final reason (usually an abort) is replaced by ``"stop"``.
- Otherwise the finish reason is the engine's (``stop``, ``length``, ``abort``, ``cancelled``,
  ``error``), reported on the sequence's final response. A guided request cut by ``max_tokens``
  therefore says ``"length"``.
- A guided sequence that finishes ``stop`` is checked against its guide (``grammar.
  check_output`` on the text decoded without special tokens). A failure is a bug upstream: the
  result carries ``error`` and ``Postprocessor.num_invalid_guided`` counts it. One cut by
  ``max_tokens`` says ``length`` and is not checked (it is partial by definition).
- ``exclude_input_in_output`` false (TensorRT-LLM's default): the first delta is prefixed by the
  prompt's text (decoded from ``options.prompt_token_ids``), which stop strings do not see.
- On the final response, text held back (an incomplete character, a possible stop prefix) is
  released, so the concatenated deltas equal decoding all the output tokens at once, cut at the stop.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Sequence

from contracts.output_options import OutputOptions
from postprocess.detokenizer import DEFAULT_CONTEXT_TOKENS, IncrementalDetokenizer, TextDecoder
from postprocess.state import DEFAULT_MAX_REQUESTS, RequestState, RequestStateTable, SequenceState, TableStats
from postprocess.stop_matcher import StopMatcher

FINISH_REASONS = ("stop", "length", "abort", "cancelled", "error")


@dataclass(frozen=True)
class ProcessedOutput:
    """The postprocess result for one engine response of one sequence."""

    text: str                    # the text_output delta (may be "")
    finish_reason: str | None    # set once the sequence is finished (and on every later response of it)
    finished: bool               # no more text will come for this sequence
    stop_engine: bool            # send the engine a `stop` for this request id (set at most once)
    num_accepted_tokens: int     # leading tokens of this response that are output (the rest came after a stop)
    num_output_tokens: int       # output tokens of this sequence so far (up to the token completing a stop)
    num_input_tokens: int        # prompt tokens (from the options)
    options: OutputOptions = field(repr=False)  # the request's options (return_* flags, stream, ...)
    error: str | None = None     # a guided output that finished "stop" but fails its guide


def normalize_finish_reason(reason) -> str | None:
    """``FinishReason`` enums, bytes and strings to a lower-case string; empty means ``None``."""
    if reason is None:
        return None
    if isinstance(reason, enum.Enum):
        reason = reason.value
    if isinstance(reason, (bytes, bytearray)):
        reason = bytes(reason).decode("utf-8", "replace")
    reason = str(reason).strip().lower()
    return reason or None


class Postprocessor:
    """Holds the tokenizer and the request-state table. One per postprocess model instance."""

    def __init__(self, tokenizer: TextDecoder, *, max_requests: int = DEFAULT_MAX_REQUESTS,
                 context_tokens: int = DEFAULT_CONTEXT_TOKENS) -> None:
        self.tokenizer = tokenizer
        self.table = RequestStateTable(max_requests)
        self.context_tokens = context_tokens
        self.requests_without_options = 0
        self.num_invalid_guided = 0      # finished guided outputs that failed their guide (bugs)

    def stats(self) -> TableStats:
        return self.table.stats()

    def drop(self, request_id: str) -> None:
        """Forget a request (e.g. the adapter saw an error response); unknown ids are ignored."""
        self.table.drop(request_id)

    def process(self, request_id: str, new_token_ids: Sequence[int], *, is_final: bool,
                finish_reason=None, options_json: str | bytes | None = None,
                seq_index: int = 0) -> ProcessedOutput:
        """One engine response. ``is_final``: this sequence's last response. ``options_json``: the
        options the engine forwards with the request's first response (ignored afterwards)."""
        state = self.table.get(request_id)
        if state is None:
            if options_json:
                options = OutputOptions.from_json(options_json)
            else:
                options = OutputOptions()
                self.requests_without_options += 1
            state = self.table.add(request_id, RequestState(options))
        seq = state.sequences.get(seq_index)
        if seq is None:
            seq = state.sequences[seq_index] = self._new_sequence(state.options)
        ids = [int(t) for t in new_token_ids]

        error = None
        if seq.finished:
            out = self._result(state, seq, "", accepted=0, stop_engine=False)
        else:
            text, accepted, stopped = self._advance(seq, ids, is_final)
            seq.num_output_tokens += accepted
            if seq.guided_ids is not None:
                seq.guided_ids.extend(ids[:accepted])
            stop_engine = False
            if stopped:
                seq.finished, seq.stopped_by_string, seq.finish_reason = True, True, "stop"
                state.num_finished += 1
                if not is_final and state.num_finished >= state.options.n and not state.engine_stop_requested:
                    state.engine_stop_requested = stop_engine = True
            elif is_final:
                seq.finished, seq.finish_reason = True, normalize_finish_reason(finish_reason)
                state.num_finished += 1
                if seq.guided_ids is not None and seq.finish_reason == "stop":
                    error = self._check_guided(state.options, seq.guided_ids)
            out = self._result(state, seq, text, accepted=accepted, stop_engine=stop_engine, error=error)

        if is_final:
            seq.engine_final = True
            if sum(1 for s in state.sequences.values() if s.engine_final) >= state.options.n:
                self.table.drop(request_id)
        return out

    def _new_sequence(self, options: OutputOptions) -> SequenceState:
        prompt_text = ""
        if not options.exclude_input_in_output and options.prompt_token_ids:
            prompt_text = self.tokenizer.decode(list(options.prompt_token_ids),
                                                skip_special_tokens=options.skip_special_tokens)
        return SequenceState(
            detokenizer=IncrementalDetokenizer(self.tokenizer, skip_special_tokens=options.skip_special_tokens,
                                               prompt_ids=options.prompt_token_ids,
                                               context_tokens=self.context_tokens),
            stop_matcher=StopMatcher(options.stop, include_stop=options.include_stop_str_in_output),
            prompt_pending=prompt_text,
            guided_ids=[] if options.guide_type else None,
        )

    def _check_guided(self, options: OutputOptions, ids: list[int]) -> str | None:
        from grammar import check_output  # xgrammar/jsonschema: only guided requests need them

        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        why = check_output(options.guide_type, options.guide, text)
        if why is None:
            return None
        self.num_invalid_guided += 1
        return f"guided_decoding_guide: internal error: the finished output {why}; output: {text[:200]!r}"

    @staticmethod
    def _advance(seq: SequenceState, ids: list[int], is_final: bool) -> tuple[str, int, bool]:
        """Feed tokens through detokenizer and stop matcher: (text, tokens accepted, stop matched)."""
        parts = [seq.prompt_pending] if seq.prompt_pending else []
        seq.prompt_pending = ""
        detok, matcher = seq.detokenizer, seq.stop_matcher
        accepted, stopped = len(ids), False
        if not matcher.stops:
            parts.append(detok.push(ids))  # no stop strings: one decode for the whole response
        else:
            for i, tok in enumerate(ids):   # token by token, to know which token completed a stop
                delta = detok.push((tok,))
                if delta:
                    r = matcher.push(delta)
                    parts.append(r.text)
                    if r.matched:
                        accepted, stopped = i + 1, True
                        break
        if is_final and not stopped:
            r = matcher.push(detok.flush())
            parts.append(r.text)
            stopped = r.matched
            if not stopped:
                parts.append(matcher.flush())
        return "".join(parts), accepted, stopped

    @staticmethod
    def _result(state: RequestState, seq: SequenceState, text: str, *, accepted: int,
                stop_engine: bool, error: str | None = None) -> ProcessedOutput:
        return ProcessedOutput(
            text=text, finish_reason=seq.finish_reason if seq.finished else None, finished=seq.finished,
            stop_engine=stop_engine, num_accepted_tokens=accepted, num_output_tokens=seq.num_output_tokens,
            num_input_tokens=state.options.num_input_tokens, options=state.options, error=error,
        )

