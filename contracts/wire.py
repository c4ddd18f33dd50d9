"""The tensors between the pipeline's Triton models: preprocess -> llm -> postprocess.

An ensemble step reads only the outputs of earlier steps, and postprocess follows a decoupled
model, so everything postprocess needs travels through the ``llm`` model: preprocess puts the
output options in the request JSON, and the llm model returns them with each sequence's first
response.

preprocess -> llm:  ``input_ids`` INT32 [-1], ``request`` BYTES [1] (``LLMRequest`` JSON),
                    ``stop`` BOOL [1] (a stop request carries no prompt; its Triton request id names
                    the request to stop; postprocess's stops also carry ``request`` =
                    ``{"stop_reason": ...}``, see ``stop_reason_json``)
ensemble -> llm:    ``lora_task_id`` UINT64 [1], ``lora_weights`` FP16 [-1, -1], ``lora_config`` INT32 [-1, 3]
                    (TensorRT-LLM's LoRA tensors, optional; backend/lora/trtllm.py)
llm -> postprocess: ``output_ids`` INT32 [-1] (new tokens of this response), ``output_log_probs``
                    FP32 [-1] (their logprobs, when asked), ``response`` BYTES [1] (``LLMResponseMeta`` JSON)
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from contracts.sampling_params import GuideSpec, SamplingParams

INPUT_IDS = "input_ids"
REQUEST = "request"
STOP = "stop"
OUTPUT_IDS = "output_ids"
OUTPUT_LOG_PROBS = "output_log_probs"
RESPONSE = "response"
LORA_TASK_ID = "lora_task_id"   # TensorRT-LLM's LoRA tensors, from the ensemble's inputs to the llm model
LORA_WEIGHTS = "lora_weights"
LORA_CONFIG = "lora_config"


def sampling_params_to_dict(params: SamplingParams) -> dict[str, Any]:
    d = dataclasses.asdict(params)
    d["stop_token_ids"] = list(params.stop_token_ids)
    d["bad_words_ids"] = [list(s) for s in params.bad_words_ids]
    d["logit_bias"] = [list(p) for p in params.logit_bias]
    return d


def sampling_params_from_dict(d: dict[str, Any]) -> SamplingParams:
    """Inverse of ``sampling_params_to_dict``; ``SamplingParams`` validates (ValueError naming the field)."""
    d = dict(d)
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"request.sampling: unknown fields {unknown}")
    if d.get("guide") is not None:
        d["guide"] = GuideSpec(**d["guide"])
    if "stop_token_ids" in d:
        d["stop_token_ids"] = tuple(d["stop_token_ids"])
    if "bad_words_ids" in d:
        d["bad_words_ids"] = tuple(tuple(s) for s in d["bad_words_ids"])
    if "logit_bias" in d:
        d["logit_bias"] = tuple(tuple(p) if isinstance(p, list) else p for p in d["logit_bias"])
    return SamplingParams(**d)


STOP_REASONS = ("stop_string", "cancelled", "error")   # why postprocess stops the engine


def stop_reason_json(reason: str) -> str:
    """The ``request`` tensor of postprocess's BLS stop: why it stops the engine (for the request log)."""
    return json.dumps({"stop_reason": reason})


def parse_stop_reason(text: str | bytes | None) -> str | None:
    """``stop_reason_json``'s reason, or None (a client's stop carries none)."""
    try:
        reason = json.loads(text).get("stop_reason") if text else None
    except (ValueError, AttributeError, UnicodeDecodeError):
        return None
    return reason if reason in STOP_REASONS else None


@dataclass
class LLMRequest:
    """What preprocess hands the engine model for one generation request."""

    sampling: SamplingParams
    stream: bool = True
    options: str = ""  # opaque to the engine: postprocess's output options (JSON text)
    request_id: str = ""  # preprocess's id for the request (the client's id when it gave one)

    def to_json(self) -> str:
        return json.dumps({"sampling": sampling_params_to_dict(self.sampling), "stream": self.stream,
                           "options": self.options, "request_id": self.request_id}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> "LLMRequest":
        try:
            d = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"request: not valid JSON ({e})") from None
        if not isinstance(d, dict) or not isinstance(d.get("sampling"), dict):
            raise ValueError("request: expected a JSON object with a 'sampling' object")
        try:
            sampling = sampling_params_from_dict(d["sampling"])
        except TypeError as e:
            raise ValueError(f"request.sampling: {e}") from None
        options = d.get("options") or ""
        if not isinstance(options, str):
            raise ValueError("request.options: expected a string")
        return cls(sampling=sampling, stream=bool(d.get("stream", True)), options=options,
                   request_id=str(d.get("request_id") or ""))


@dataclass
class LLMResponseMeta:
    """Everything about one llm response besides its token ids and logprobs."""

    request_id: str                    # the engine's id: postprocess keys its state on (request_id, seq_index)
    seq_index: int = 0
    finished: bool = False             # this sequence's last response
    request_finished: bool = False     # the request's last response (sent with the FINAL flag)
    finish_reason: str | None = None   # stop | length | abort | error
    error: str | None = None
    options: str | None = None         # postprocess's options (opaque text), on each sequence's first response
    cum_logprob: float | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_draft_tokens: int = 0          # speculative drafts verified for this sequence so far
    num_accepted_draft_tokens: int = 0  # of which accepted
    stop_ack: bool = False             # the answer to a `stop` request (no sequence of its own)
    # per token of this response, when the request asked for top_logprobs: its [token id, logprob]
    # alternatives, most likely first
    top_logprobs: list[list[list[float]]] | None = None

    def to_json(self) -> str:
        # one per streamed response: the fields' values are flat, so vars() needs no deep copy (asdict)
        d = {k: v for k, v in vars(self).items() if v not in (None, False)}   # 0 too: the defaults
        d["request_id"] = self.request_id
        return _COMPACT.encode(d)

    @classmethod
    def from_json(cls, text: str | bytes) -> "LLMResponseMeta":
        d = json.loads(text)
        return cls(**{k: v for k, v in d.items() if k in _META_FIELDS})


_META_FIELDS = frozenset(f.name for f in dataclasses.fields(LLMResponseMeta))
_COMPACT = json.JSONEncoder(separators=(",", ":"))
