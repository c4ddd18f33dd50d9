"""logprobs.py: token texts for a response of several tokens, split by the model's tokenizer when they re-encode."""
from __future__ import annotations

from gateway.config import REPO
from gateway.openai.logprobs import logprob_entries, token_strings
from preprocess import load_tokenizer

TOK = load_tokenizer(REPO / "models" / "demo-target")


def test_one_token_is_the_text_and_several_are_split_by_the_tokenizer():
    assert token_strings(TOK, " foo", 1) == [" foo"]
    text = "def fibonacci(n):"
    ids = TOK.encode(text, add_special_tokens=False)
    split = token_strings(TOK, text, len(ids))
    assert len(split) == len(ids) > 1 and "".join(split) == text


def test_a_count_that_does_not_match_puts_the_text_on_the_first():
    assert token_strings(TOK, "x", 3) == ["x", "", ""]
    assert token_strings(None, "ab", 2) == ["ab", ""]


def test_entries_carry_bytes_and_empty_alternatives():
    (entry,) = logprob_entries("é", [-0.25])
    assert entry == {"token": "é", "logprob": -0.25, "bytes": [195, 169], "top_logprobs": []}
    assert logprob_entries("", []) == []
