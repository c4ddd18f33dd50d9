"""The ``logprobs`` of a response: one entry per returned token, with the token's text where it is known.

The ensemble returns each token's logprob and the text of the response, not the token ids. A response of
one token is that token's text. A response of several (the engine's stream interval, or speculation
accepting several tokens in a step) is split by the model's tokenizer when the text re-encodes to as many
tokens; otherwise its text goes on the first entry and the others are empty. The top alternatives
(``top_logprobs`` > 0) come from the ensemble's ``top_log_probs``, each with its own text.
"""
from __future__ import annotations

from typing import Callable

Splitter = Callable[[str, int], list[str]]


def token_strings(tokenizer, text: str, count: int) -> list[str]:
    """``count`` token texts for ``text`` (see the module docstring)."""
    if count == 1:
        return [text]
    if tokenizer is not None and text:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == count:
            return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    return [text] + [""] * (count - 1)


def logprob_entries(text: str, logprobs: list[float], split: Splitter | None = None,
                    top: list[list[tuple[str, float]]] | None = None) -> list[dict]:
    """Chat's ``logprobs.content`` entries (completions reads the same fields); ``top``: per token, its
    alternatives as ``(text, logprob)``, most likely first."""
    if not logprobs:
        return []
    tokens = split(text, len(logprobs)) if split is not None else token_strings(None, text, len(logprobs))
    tops = top if top and len(top) == len(logprobs) else [[] for _ in logprobs]
    return [{"token": t, "logprob": lp, "bytes": list(t.encode()),
             "top_logprobs": [{"token": a, "logprob": alp, "bytes": list(a.encode())} for a, alp in alts]}
            for t, lp, alts in zip(tokens, logprobs, tops)]
