"""The ensemble's ``logit_bias`` input: OpenAI's ``{"<token id>": bias}`` as a JSON object in one BYTES element.

``parse_logit_bias`` turns it into ``SamplingParams.logit_bias`` pairs, sorted by token id. Every refusal is a
``RequestError`` naming ``logit_bias`` and, where there is one, the token: a key that is not a decimal token id, an
id outside the tokenizer's vocabulary, a bias that is not a number in [-100, 100], a token given twice, more than
``max_logit_bias`` entries (docs/api.md).
"""
from __future__ import annotations

import json
import math

from contracts.sampling_params import LOGIT_BIAS_BOUND
from preprocess.errors import RequestError

FIELD = "logit_bias"


class _Pairs(list):
    """A JSON object's (key, value) pairs in order (json's ``object_pairs_hook``): duplicate keys are kept, so they
    can be refused."""


def parse_logit_bias(text: str, vocab_size: int, limit: int) -> tuple[tuple[int, float], ...]:
    """``'{"5": -100, "17": 2.5}'`` -> ``((5, -100.0), (17, 2.5))``; ``""`` or ``"{}"`` -> ``()``."""
    if not text.strip():
        return ()
    try:
        obj = json.loads(text, object_pairs_hook=_Pairs)
    except ValueError as e:
        raise RequestError(FIELD, f"not valid JSON ({e})") from None
    if not isinstance(obj, _Pairs):
        raise RequestError(FIELD, 'expected a JSON object of token id -> bias ({"5": -100})')
    if len(obj) > limit:
        raise RequestError(FIELD, f"too many: {len(obj)} tokens (limit {limit}, max_logit_bias)")
    out: dict[int, float] = {}
    for key, bias in obj:
        if not (key.isascii() and key.isdigit()):
            raise RequestError(FIELD, f"key {key[:40]!r} is not a token id (a decimal integer)")
        token = int(key)
        if token >= vocab_size:
            raise RequestError(FIELD, f"token id {token} is outside the vocabulary [0, {vocab_size})")
        if token in out:
            raise RequestError(FIELD, f"token id {token} is given twice")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias) \
                or not -LOGIT_BIAS_BOUND <= bias <= LOGIT_BIAS_BOUND:
            raise RequestError(FIELD, f"the bias of token {token} must be a number in "
                                      f"[-{LOGIT_BIAS_BOUND:g}, {LOGIT_BIAS_BOUND:g}], got {json.dumps(bias)[:40]}")
        out[token] = float(bias)
    return tuple(sorted(out.items()))
