"""The ``top_log_probs`` output: each returned token's most likely alternatives, with their text.

The llm model sends the alternatives as ``[token id, logprob]`` pairs (``LLMResponseMeta.top_logprobs``);
postprocess adds each token's own text, decoded alone with special tokens kept, so a client needs no
tokenizer. A byte-level token that is part of a UTF-8 character decodes to U+FFFD: its text is not a
character of its own.
"""
from __future__ import annotations

import json
from typing import Sequence

from postprocess.detokenizer import TextDecoder


def top_logprobs_json(decoder: TextDecoder, alternatives: Sequence[Sequence[Sequence[float]]]) -> str:
    """``[[{"token_id", "token", "logprob"}, ...] per token]`` as JSON, most likely first."""
    return json.dumps([[{"token_id": int(tid), "token": decoder.decode([int(tid)], skip_special_tokens=False),
                         "logprob": float(lp)} for tid, lp in token] for token in alternatives],
                      ensure_ascii=False, separators=(",", ":"))
