"""Per-request generation options, validated once at the boundary.

Every check raises ``ValueError`` naming the offending field, so the Triton
adapters can turn it into a client error without crashing the engine.
"""
from __future__ import annotations

from dataclasses import dataclass

from contracts.validation import check_float as _check_float
from contracts.validation import check_int as _check_int

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar", "structural_tag")
LOGIT_BIAS_BOUND = 100.0   # OpenAI's range for a logit bias: [-100, 100]


@dataclass(frozen=True)
class GuideSpec:
    """A structured-output constraint: ``kind`` is json | json_schema | regex | ebnf_grammar | structural_tag."""

    kind: str
    guide: str = ""


@dataclass(frozen=True)
class SamplingParams:
    """Options for one request. Defaults follow vLLM (temperature 1, filters off).

    Terms: ``top_k=0`` disables top-k; ``top_p=1`` disables top-p; ``min_p=0`` disables min-p.
    ``logprobs=None`` returns none; ``0`` returns the chosen token's logprob; ``k`` adds the top-k.
    ``stop_token_ids`` end a sequence like EOS (``end_id`` in the Triton API).
    ``logit_bias``: ``(token id, bias)`` pairs, one per token id, each bias in [-100, 100], added to the
    token's logit before temperature (docs/sampling.md); token ids are checked against the vocabulary by
    ``check_vocab`` (the engine calls it in ``Scheduler.check_request``).
    """

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    n: int = 1
    logprobs: int | None = None
    guide: GuideSpec | None = None
    num_speculative_tokens: int | None = None   # this request's cap on drafts per step (0: off; None: the engine's)
    lora_name: str | None = None                # the LoRA adapter this request runs under (None: the base model)
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, bias) pairs, ids unique

    def __post_init__(self) -> None:
        _check_int("max_tokens", self.max_tokens, lo=1)
        _check_int("min_tokens", self.min_tokens, lo=0)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens: {self.min_tokens} must not exceed max_tokens ({self.max_tokens})")
        _check_float("temperature", self.temperature, lo=0.0)
        _check_int("top_k", self.top_k, lo=0)
        _check_float("top_p", self.top_p, lo=0.0, lo_open=True, hi=1.0)
        _check_float("min_p", self.min_p, lo=0.0, hi=1.0)
        _check_float("repetition_penalty", self.repetition_penalty, lo=0.0, lo_open=True)
        _check_float("presence_penalty", self.presence_penalty, lo=-2.0, hi=2.0)
        _check_float("frequency_penalty", self.frequency_penalty, lo=-2.0, hi=2.0)
        if self.seed is not None:
            _check_int("seed", self.seed, lo=0, hi=2**64 - 1)
        for t in self.stop_token_ids:
            _check_int("stop_token_ids", t, lo=0)
        for seq in self.bad_words_ids:
            if not seq:
                raise ValueError("bad_words_ids: empty token sequence")
            for t in seq:
                _check_int("bad_words_ids", t, lo=0)
        check_logit_bias(self.logit_bias)
        _check_int("n", self.n, lo=1, hi=64)
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, lo=0, hi=20)
        if self.num_speculative_tokens is not None:
            _check_int("num_speculative_tokens", self.num_speculative_tokens, lo=0, hi=64)
        if self.lora_name is not None and (not isinstance(self.lora_name, str) or not self.lora_name
                                           or len(self.lora_name) > 128):
            raise ValueError(f"lora_name: expected an adapter name (1..128 characters), got {self.lora_name!r}")
        if self.guide is not None:
            if self.guide.kind not in GUIDE_TYPES:
                raise ValueError(
                    f"guided_decoding_guide_type: unknown type {self.guide.kind!r} "
                    "(expected json, json_schema, regex, ebnf_grammar or structural_tag)"
                )
            # the grammar decides where a guided output ends: nothing else may end it or hold off its end
            if self.stop_token_ids:
                raise ValueError("stop_token_ids: not supported with guided decoding (a stop token could cut "
                                 "the output in the middle of a value)")
            if self.min_tokens:
                raise ValueError("min_tokens: not supported with guided decoding (the grammar decides where "
                                 "the output may end)")
            if self.ignore_eos:
                raise ValueError("ignore_eos: not supported with guided decoding (the grammar ends with EOS)")

    def check_vocab(self, vocab_size: int) -> None:
        """The token ids this request names are in the model's vocabulary ``[0, vocab_size)``."""
        for t, _ in self.logit_bias:
            if t >= vocab_size:
                raise ValueError(f"logit_bias: token id {t} is outside the vocabulary [0, {vocab_size})")


def check_logit_bias(pairs) -> None:
    """``(token id, bias)`` pairs: ids integers >= 0 and unique, biases finite in [-100, 100]; the
    ``ValueError`` names ``logit_bias`` and the token."""
    if not isinstance(pairs, tuple):
        raise ValueError(f"logit_bias: expected a tuple of (token id, bias) pairs, got {type(pairs).__name__}")
    seen = set()
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise ValueError(f"logit_bias: expected (token id, bias) pairs, got {pair!r}")
        token, bias = pair
        _check_int("logit_bias", token, lo=0)
        if token in seen:
            raise ValueError(f"logit_bias: token id {token} is given twice")
        seen.add(token)
        try:
            _check_float("logit_bias", bias, lo=-LOGIT_BIAS_BOUND, hi=LOGIT_BIAS_BOUND)
        except ValueError:
            raise ValueError(f"logit_bias: the bias of token {token} must be a number in "
                             f"[-{LOGIT_BIAS_BOUND:g}, {LOGIT_BIAS_BOUND:g}], got {bias!r}") from None
