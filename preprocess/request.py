"""Parse and validate one Triton request (TensorRT-LLM input names) into a ``PreprocessedRequest``.

The inputs and their defaults are documented in docs/api.md. Every problem raises
``RequestError`` whose ``field`` is the Triton input name at fault. Range checks reuse
``SamplingParams``' validation by constructing it, with its field names mapped back to inputs.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from contracts.field_names import ensemble_input_name
from contracts.output_options import OutputOptions
from contracts.sampling_params import GUIDE_TYPES, GuideSpec, SamplingParams  # noqa: F401 (re-exported)
from preprocess.chat_template import ChatTemplate, ChatTemplateError
from preprocess.errors import RequestError
from preprocess.inputs import UINT64, get_bool, get_float, get_int, get_str, get_str_list
from preprocess.limits import RequestLimits  # also re-exported: callers import it from here
from preprocess.logit_bias import parse_logit_bias
from preprocess.tokenizer import Tokenizer

# Every input this parser understands (TensorRT-LLM names, plus our messages / skip / include-stop).
KNOWN_INPUTS = frozenset({
    "text_input", "messages", "max_tokens", "stream", "temperature", "top_p", "top_k", "min_p",
    "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop_words", "bad_words",
    "end_id", "pad_id", "min_tokens", "min_length", "num_return_sequences", "beam_width",
    "exclude_input_in_output", "return_log_probs", "return_num_input_tokens", "return_num_output_tokens",
    "guided_decoding_guide_type", "guided_decoding_guide", "skip_special_tokens", "include_stop_str_in_output",
    "num_speculative_tokens", "return_perf_metrics", "top_logprobs", "lora_name", "ignore_eos", "logit_bias",
})

MAX_TOP_LOGPROBS = 20   # OpenAI's bound (chat top_logprobs, completions logprobs)

# Boolean inputs carried in the output options, with their defaults (TensorRT-LLM's where it has one).
_FLAG_DEFAULTS = {
    "include_stop_str_in_output": False, "skip_special_tokens": True, "exclude_input_in_output": False,
    "stream": False, "return_log_probs": False, "return_num_input_tokens": False,
    "return_num_output_tokens": False, "return_perf_metrics": False,
}


@dataclass(frozen=True)
class PreprocessedRequest:
    """One validated request: what the engine needs, and what postprocess needs (``options``)."""

    prompt_token_ids: tuple[int, ...]
    prompt_text: str
    sampling_params: SamplingParams
    options: OutputOptions

    @property
    def stop(self) -> tuple[str, ...]:
        return self.options.stop

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def options_json(self) -> str:
        return self.options.to_json()


def output_options_json(request: PreprocessedRequest) -> str:
    """The JSON string the engine forwards to postprocess with the request's first response."""
    return request.options.to_json()


class RequestParser:
    """Holds the tokenizer, the compiled chat template and the limits; ``parse`` is thread-safe."""

    def __init__(self, tokenizer: Tokenizer, limits: RequestLimits | None = None) -> None:
        self.tokenizer = tokenizer
        self.limits = limits or RequestLimits()
        self.max_model_len = self.limits.max_model_len or tokenizer.model_max_length
        src = tokenizer.chat_template
        self.chat_template = ChatTemplate(src, tokenizer.template_variables()) if src else None

    def parse(self, inputs: Mapping[str, Any]) -> PreprocessedRequest:
        """Validate ``inputs`` (name -> numpy array or None) and tokenize the prompt."""
        for name in inputs:
            if name not in KNOWN_INPUTS:
                raise RequestError(name, "unknown input")
        beam = get_int(inputs, "beam_width", 1)
        if beam != 1:
            raise RequestError("beam_width", f"beam search is not supported (beam_width must be 1, got {beam})")
        get_int(inputs, "pad_id", None)  # accepted for TensorRT-LLM clients, type-checked, unused

        max_tokens = get_int(inputs, "max_tokens", None)
        if max_tokens is None:
            raise RequestError("max_tokens", "required input is missing")
        if max_tokens <= 0:
            raise RequestError("max_tokens", f"must be >= 1, got {max_tokens}")
        guide = self._guide(inputs)
        stop = tuple(self._stop_words(inputs))
        if guide is not None and stop:
            raise RequestError("stop_words", "not supported with guided decoding: a stop string could cut the "
                                             "output in the middle of a value (the grammar decides where it ends)")
        flags = {name: get_bool(inputs, name, default) for name, default in _FLAG_DEFAULTS.items()}
        params = self._sampling_params(inputs, max_tokens, guide, flags["return_log_probs"])
        # The prompt last: tokenizing is the expensive step, so every cheap check runs first.
        prompt_text, prompt_ids = self._prompt(inputs)
        tail = self.limits.prompt_tail_tokens
        exclude_input = flags["exclude_input_in_output"]
        options = OutputOptions(
            stop=stop, n=params.n, num_input_tokens=len(prompt_ids),
            prompt_token_ids=tuple(prompt_ids[-tail:] if tail else ()) if exclude_input else tuple(prompt_ids),
            guide_type=guide.kind if guide else None, guide=guide.guide if guide else "", **flags,
        )
        return PreprocessedRequest(tuple(prompt_ids), prompt_text, params, options)

    # -- prompt -------------------------------------------------------------------------------
    def _prompt(self, inputs: Mapping[str, Any]) -> tuple[str, list[int]]:
        text = get_str(inputs, "text_input")
        raw_messages = get_str(inputs, "messages")
        if text is not None and raw_messages is not None:
            raise RequestError("messages", "give either text_input or messages, not both")
        if text is None and raw_messages is None:
            raise RequestError("text_input", "required input is missing (or send messages)")
        field = "text_input" if text is not None else "messages"
        raw = text if text is not None else raw_messages
        size = len(raw.encode("utf-8"))
        if size > self.limits.max_prompt_bytes:
            raise RequestError(field, f"too large: {size} bytes "
                                      f"(limit {self.limits.max_prompt_bytes}, max_prompt_bytes)")
        if text is not None:
            if text == "":
                raise RequestError("text_input", "empty prompt")
            prompt_text, ids = text, self.tokenizer.encode(text, add_special_tokens=True)
        else:
            prompt_text = self._render(raw_messages)
            ids = self.tokenizer.encode(prompt_text, add_special_tokens=False)  # the template wrote BOS
        if not ids:
            raise RequestError(field, "the prompt encodes to no tokens")
        limit = self.max_model_len
        if limit is not None and len(ids) >= limit:
            raise RequestError(field, f"prompt is {len(ids)} tokens; the model's context is {limit} tokens "
                                      f"(at most {limit - 1} prompt tokens, to leave room for output)")
        cap = self.limits.max_prompt_tokens
        if cap is not None and len(ids) > cap:
            raise RequestError(field, f"prompt is {len(ids)} tokens, more than the limit of {cap} (max_prompt_tokens)")
        return prompt_text, ids

    def _render(self, raw: str) -> str:
        try:
            messages = json.loads(raw)
        except json.JSONDecodeError as e:
            raise RequestError("messages", f"not valid JSON ({e})") from None
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages", "expected a non-empty JSON list of {role, content} objects")
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise RequestError("messages", f"message {i} is not an object")
            if not isinstance(m.get("role"), str) or not m["role"]:
                raise RequestError("messages", f"message {i}: 'role' must be a non-empty string")
            content = m.get("content")
            parts_ok = isinstance(content, list) and all(isinstance(c, dict) for c in content)
            if not (isinstance(content, str) or parts_ok):
                raise RequestError("messages", f"message {i}: 'content' must be a string or a list of parts")
        if self.chat_template is None:
            raise RequestError("messages", "this model has no chat_template; send text_input instead")
        try:
            rendered = self.chat_template.render(messages, add_generation_prompt=True)
        except ChatTemplateError as e:
            raise RequestError("messages", f"chat template: {e}") from None
        if not rendered:
            raise RequestError("messages", "the chat template rendered an empty prompt")
        return rendered

    # -- words --------------------------------------------------------------------------------
    def _stop_words(self, inputs: Mapping[str, Any]) -> list[str]:
        words = get_str_list(inputs, "stop_words") or []
        lim = self.limits
        if len(words) > lim.max_stop_words:
            raise RequestError("stop_words", f"too many: {len(words)} (limit {lim.max_stop_words}, max_stop_words)")
        out: list[str] = []
        for w in words:
            if not w:
                raise RequestError("stop_words", "empty stop string")
            if len(w) > lim.max_stop_word_chars:
                raise RequestError("stop_words",
                                   f"stop string of {len(w)} characters "
                                   f"(limit {lim.max_stop_word_chars}, max_stop_word_chars)")
            if w not in out:
                out.append(w)
        return out

    def _bad_words(self, inputs: Mapping[str, Any]) -> tuple[tuple[int, ...], ...]:
        words = get_str_list(inputs, "bad_words") or []
        if len(words) > self.limits.max_bad_words:
            raise RequestError("bad_words",
                               f"too many: {len(words)} (limit {self.limits.max_bad_words}, max_bad_words)")
        seqs: list[tuple[int, ...]] = []
        for w in words:
            if not w:
                raise RequestError("bad_words", "empty bad word")
            variants = [w] if w.startswith(" ") else [w, " " + w]
            for v in variants:
                ids = tuple(self.tokenizer.encode(v, add_special_tokens=False))
                if ids and ids not in seqs:
                    seqs.append(ids)
        return tuple(seqs)

    # -- sampling -----------------------------------------------------------------------------
    def _guide(self, inputs: Mapping[str, Any]) -> GuideSpec | None:
        """The guide, checked cheaply here (JSON, the schema allow-list, regex and grammar syntax) so a
        bad one never reaches the engine. Rules: grammar/guides.py, docs/api.md."""
        kind = get_str(inputs, "guided_decoding_guide_type")
        guide = get_str(inputs, "guided_decoding_guide")
        if not kind and not guide:
            return None
        from grammar import GuideError, check_guide  # xgrammar: loaded at model start-up

        try:
            check_guide(kind, guide, max_chars=self.limits.max_guide_chars, max_depth=self.limits.max_guide_depth)
        except GuideError as e:
            raise RequestError(e.field, e.message) from None
        return GuideSpec(kind=kind, guide="" if kind == "json" else guide)

    @staticmethod
    def _num_logprobs(inputs: Mapping[str, Any], logprobs: bool) -> int | None:
        """``None`` (no logprobs), ``0`` (the chosen token's) or ``k`` (plus the ``k`` most likely tokens)."""
        top = get_int(inputs, "top_logprobs", 0)
        if not 0 <= top <= MAX_TOP_LOGPROBS:
            raise RequestError("top_logprobs", f"must be in [0, {MAX_TOP_LOGPROBS}], got {top}")
        if top and not logprobs:
            raise RequestError("top_logprobs", "needs return_log_probs: true")
        return top if logprobs else None

    def _num_return_sequences(self, inputs: Mapping[str, Any]) -> int:
        n = get_int(inputs, "num_return_sequences", 1)
        cap = self.limits.max_num_return_sequences
        if n > cap:
            raise RequestError("num_return_sequences", f"{n} samples, more than the limit of {cap} "
                                                       "(max_num_return_sequences)")
        return n

    def _sampling_params(self, inputs: Mapping[str, Any], max_tokens: int, guide: GuideSpec | None,
                         logprobs: bool) -> SamplingParams:
        min_tokens = get_int(inputs, "min_tokens", None)
        min_length = get_int(inputs, "min_length", None)
        if min_tokens is not None and min_length is not None and min_tokens != min_length:
            raise RequestError("min_tokens",
                               f"min_tokens ({min_tokens}) and its alias min_length ({min_length}) differ")
        min_field = "min_tokens" if min_tokens is not None or min_length is None else "min_length"
        end_id = get_int(inputs, "end_id", None)
        if end_id is not None and not 0 <= end_id < self.tokenizer.vocab_size:
            raise RequestError("end_id", f"must be a token id in [0, {self.tokenizer.vocab_size - 1}], got {end_id}")
        kwargs = dict(
            max_tokens=max_tokens,
            min_tokens=min_tokens if min_tokens is not None else (min_length if min_length is not None else 0),
            temperature=get_float(inputs, "temperature", 1.0),
            top_k=get_int(inputs, "top_k", 0),
            top_p=get_float(inputs, "top_p", 1.0),
            min_p=get_float(inputs, "min_p", 0.0),
            repetition_penalty=get_float(inputs, "repetition_penalty", 1.0),
            presence_penalty=get_float(inputs, "presence_penalty", 0.0),
            frequency_penalty=get_float(inputs, "frequency_penalty", 0.0),
            seed=get_int(inputs, "seed", None, bounds=UINT64),
            stop_token_ids=(end_id,) if end_id is not None else (),
            bad_words_ids=self._bad_words(inputs),
            n=self._num_return_sequences(inputs),
            logprobs=self._num_logprobs(inputs, logprobs),
            guide=guide,
            num_speculative_tokens=get_int(inputs, "num_speculative_tokens", None),
            lora_name=get_str(inputs, "lora_name") or None,   # the engine checks that it is served
            ignore_eos=get_bool(inputs, "ignore_eos", False),
            logit_bias=parse_logit_bias(get_str(inputs, "logit_bias") or "", self.tokenizer.vocab_size,
                                        self.limits.max_logit_bias),
        )
        try:
            return SamplingParams(**kwargs)
        except ValueError as e:
            raise _as_request_error(e, min_field) from None


def _as_request_error(e: ValueError, min_field: str) -> RequestError:
    """Map SamplingParams' ``"<field>: ..."`` / ``"<field> (..) ..."`` message to the Triton input name."""
    msg = str(e)
    m = re.match(r"\s*([a-z_]+)", msg)
    name = m.group(1) if m else "request"
    field = min_field if name == "min_tokens" else ensemble_input_name(name)
    rest = msg[len(m.group(0)):] if m else ""
    return RequestError(field, rest[1:].strip() if rest.startswith(":") else msg)
