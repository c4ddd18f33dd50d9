"""One JSON line per finished request, on the server's stderr, that is enough to reproduce its output.

The line carries the request's ids (the client's, the engine's, the trace's), a SHA-256 of the prompt
token ids (``prompt_sha256``: ``sha256(int32 little-endian bytes)``, see ``token_sha256``), the token
counts, the whole sampling tuple with the seed it was sampled with (drawn by the engine when the
client gave none: ``seed_drawn``), the output options postprocess applies (stop strings, ...), the
finish reason, the latencies, a SHA-256 of each sequence's output token ids, and the formats that served
it (``quantization`` of the weights, ``kv_cache_dtype``, ``dtype``: backend/engine/builder.py ``ServedFormats``). Sending the same
prompt with the same tuple (seed included) gives the same tokens, which the output hash confirms
(with speculative decoding, only greedy replays are exact). The prompt itself is never logged.

Logged at INFO on the ``triton_llm.requests`` logger, which writes to stderr (tritonserver's log);
``request_log_level`` (``config.pbtxt`` of the llm model: debug, info, warning, error or off) sets
its level, so ``warning`` silences the lines.
"""
from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import IO, Any, Sequence

import numpy as np

from backend.serving.telemetry import FinishedRequest, f32

LOGGER_NAME = "triton_llm.requests"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
          "off": logging.CRITICAL + 10}
# output options that change the text (the prompt tail it carries is left out)
LOGGED_OPTIONS = ("stop", "include_stop_str_in_output", "skip_special_tokens", "exclude_input_in_output", "stream",
                  "return_log_probs")


def token_sha256(token_ids: Sequence[int] | np.ndarray) -> str:
    """SHA-256 of token ids as little-endian int32 bytes (how the log identifies prompts and outputs)."""
    return hashlib.sha256(np.asarray(token_ids, dtype="<i4").tobytes()).hexdigest()


def parse_level(value: str | None) -> int:
    name = (value or "info").strip().lower()
    if name not in LEVELS:
        raise ValueError(f"request_log_level: expected one of {', '.join(LEVELS)}, got {value!r}")
    return LEVELS[name]


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def log_record(rec: FinishedRequest, formats: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The log line's fields, in a stable order; ``formats``: the weight / KV / compute formats serving it."""
    p, s = rec.params, rec.stats
    seed = s.seed if s is not None else p.seed
    parsed = rec.output_options
    options = {"unparsed": True} if parsed is None else {k: parsed[k] for k in LOGGED_OPTIONS if k in parsed}
    guide = p.guide
    return {
        "event": "request_finished",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(rec.finished_wall)) +
                f".{int(rec.finished_wall * 1000) % 1000:03d}Z",
        "model": rec.model_name,
        "lora_name": p.lora_name,
        "request_id": rec.client_id,
        "engine_request_id": rec.engine_id,
        "trace_id": rec.trace_id,
        "prompt_sha256": rec.prompt_sha256,
        "prompt_tokens": s.num_prompt_tokens if s is not None else rec.num_prompt_tokens,
        "cached_prompt_tokens": s.num_cached_tokens if s is not None else 0,
        "output_tokens": s.num_output_tokens if s is not None else 0,
        "output_sha256": list(rec.output_sha256),
        "sampling": {
            "seed": seed, "temperature": f32(p.temperature), "top_k": p.top_k, "top_p": f32(p.top_p),
            "min_p": f32(p.min_p), "repetition_penalty": f32(p.repetition_penalty),
            "presence_penalty": f32(p.presence_penalty), "frequency_penalty": f32(p.frequency_penalty),
            "max_tokens": p.max_tokens, "min_tokens": p.min_tokens,
            "n": p.n, "stop_token_ids": list(p.stop_token_ids), "ignore_eos": p.ignore_eos,
            "bad_words_ids": [list(w) for w in p.bad_words_ids],
            "logit_bias": [[t, f32(b)] for t, b in p.logit_bias], "logprobs": p.logprobs,
            "guide_type": guide.kind if guide else None,
            "guide_sha256": hashlib.sha256(guide.guide.encode()).hexdigest() if guide else None,
        },
        "seed_drawn": p.seed is None and seed is not None,
        "output_options": options,
        "finish_reason": rec.finish_reason,
        "finish_reasons": list(rec.finish_reasons),
        "stopped_by": rec.stopped_by,
        "error": rec.error,
        "queue_s": _round(s.queue_time) if s else None,
        "ttft_s": _round(s.time_to_first_token) if s else None,
        "tpot_s": _round(s.time_per_output_token) if s else None,
        "e2e_s": _round(s.e2e_latency) if s else None,
        "prefill_chunks": s.num_prefill_chunks if s else 0,
        "decode_steps": s.num_decode_steps if s else 0,
        "preemptions": s.num_preemptions if s else 0,
        **stop_timing(rec),
        **(formats or {}),
    }


def stop_timing(rec: FinishedRequest) -> dict[str, Any]:
    """When the request arrived (Unix seconds), and, from then, when its last engine step ended and when a stop
    reached the llm model (a stop request, a cancellation, postprocess's stop); the steps that ended between an
    abort reaching the engine and its taking effect. Null where the request never got there."""
    s = rec.stats
    if s is None:
        return {"arrival_unix": None, "last_step_s": None, "stop_s": None, "steps_after_stop": None}
    since = lambda t: None if t is None else _round(t - s.arrival_time)  # noqa: E731
    return {"arrival_unix": _round(s.arrival_time + rec.wall_offset), "last_step_s": since(s.last_step_time),
            "stop_s": since(rec.stopped_at), "steps_after_stop": s.steps_after_abort}


class RequestLog:
    """Writes ``log_record`` as one JSON line at INFO on ``triton_llm.requests`` (stderr by default)."""

    def __init__(self, level: int | str = logging.INFO, stream: IO[str] | None = None,
                 formats: Mapping[str, str] | None = None):
        self.formats = dict(formats) if formats else None   # quantization, kv_cache_dtype, dtype of every line
        self.logger = logging.getLogger(LOGGER_NAME)
        self.logger.propagate = False
        self.logger.setLevel(parse_level(level) if isinstance(level, str) else level)
        for h in list(self.logger.handlers):
            self.logger.removeHandler(h)
        handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        self.logger.addHandler(handler)

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)

    def write(self, rec: FinishedRequest) -> None:
        if self.enabled:
            # ASCII JSON: the stubs' stderr may encode only ASCII (backslashreplace would then write `\xe9`,
            # which is no JSON escape), and client ids or errors can hold any text, lone surrogates included
            self.logger.info(json.dumps(log_record(rec, self.formats), separators=(",", ":")))
