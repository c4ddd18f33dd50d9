"""The request limits preprocess enforces, one setting each (``config.pbtxt`` parameters of ``preprocess``).

Each limit has a default, and a request past it gets a ``RequestError`` naming the input at fault and
the setting (``stop_words: too many: 70 (limit 64, max_stop_words)``). The table, with the limits the
gateway and the engine enforce beside these, is in docs/api.md ("Limits").
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from contracts.triton_config import int_param

MAX_SAMPLES = 64        # SamplingParams' own bound on n (num_return_sequences)
MAX_GUIDE_DEPTH = 100   # grammar.nesting.MAX_PARSE_DEPTH (not imported: importing grammar loads xgrammar)


@dataclass(frozen=True)
class RequestLimits:
    """Server-side limits. ``max_model_len``: the model's context in tokens (``None``: the tokenizer's
    ``model_max_length``; no check when both are unknown). ``max_prompt_tokens``: ``None`` allows up to
    the context less one (room for one output token)."""

    max_prompt_bytes: int = 1_000_000
    max_model_len: int | None = None
    max_prompt_tokens: int | None = None
    max_stop_words: int = 64
    max_stop_word_chars: int = 1_000
    max_bad_words: int = 256
    max_logit_bias: int = 1024           # tokens in one logit_bias
    max_num_return_sequences: int = MAX_SAMPLES
    max_guide_chars: int = 200_000       # grammar.guides.MAX_GUIDE_CHARS
    max_guide_depth: int = 64            # grammar.nesting.DEFAULT_MAX_DEPTH
    prompt_tail_tokens: int = 8

    def __post_init__(self) -> None:
        for name in ("max_prompt_bytes", "max_stop_words", "max_stop_word_chars", "max_bad_words", "max_logit_bias",
                     "max_num_return_sequences", "max_guide_chars", "max_guide_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        if self.max_num_return_sequences > MAX_SAMPLES:
            raise ValueError(f"max_num_return_sequences: at most {MAX_SAMPLES}, got {self.max_num_return_sequences}")
        if self.max_guide_depth > MAX_GUIDE_DEPTH:
            raise ValueError(f"max_guide_depth: at most {MAX_GUIDE_DEPTH}, got {self.max_guide_depth}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len: must be >= 2")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError("max_prompt_tokens: must be >= 1")
        if self.prompt_tail_tokens < 0:
            raise ValueError("prompt_tail_tokens: must be >= 0")

    @classmethod
    def from_parameters(cls, params: dict[str, str], **defaults: int) -> "RequestLimits":
        """The limits a model config sets (integer parameters named as the fields); ``defaults`` fill
        the ones it leaves empty (the checkpoint's context for ``max_model_len``)."""
        values = dict(defaults)
        for f in dataclasses.fields(cls):
            value = int_param(params, f.name, None)
            if value is not None:
                values[f.name] = value
        return cls(**values)
