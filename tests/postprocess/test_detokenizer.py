"""postprocess.detokenizer: incremental deltas never break characters or lose spaces, and
concatenate to the one-shot decode (property tests over the demo tokenizer)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from postprocess.detokenizer import IncrementalDetokenizer
from preprocess.tokenizer import load_tokenizer
from tests.helpers.checkpoints import DEMO_TARGET  # noqa: E402

DEMO = DEMO_TARGET
TOK = load_tokenizer(DEMO)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text with multi-byte characters the demo vocabulary splits into several byte tokens.
ALPHABET = st.sampled_from(list("ab xyz\n\t_().:=") + ["é", "ß", "你", "好", "語", "😀", "🚀", "👍🏽", "\u0301",
                                                      "\U0001f468\u200d\U0001f469", "<|end|>", "<|bos|>"])
texts = st.lists(ALPHABET, min_size=0, max_size=25).map("".join)
random_ids = st.lists(st.integers(0, TOK.vocab_size - 1), min_size=0, max_size=30)


def chunked(ids: list[int], cuts: list[int]) -> list[list[int]]:
    """Split ids into consecutive chunks at the given (unsorted, possibly repeated) positions."""
    bounds = sorted({0, len(ids), *(c % (len(ids) + 1) for c in cuts)})
    return [ids[a:b] for a, b in zip(bounds, bounds[1:])]


def stream(ids: list[int], cuts: list[int], skip: bool, prompt=()) -> tuple[list[str], str]:
    d = IncrementalDetokenizer(TOK, skip_special_tokens=skip, prompt_ids=prompt)
    deltas = [d.push(c) for c in chunked(ids, cuts)]
    return deltas, d.flush()


@FAST
@given(ids=random_ids, cuts=st.lists(st.integers(0, 40), max_size=10), skip=st.booleans())
def test_random_ids_concatenate_to_one_shot_decode(ids, cuts, skip):
    deltas, tail = stream(ids, cuts, skip)
    assert "".join(deltas) + tail == TOK.decode(ids, skip_special_tokens=skip)


@FAST
@given(ids=random_ids, cuts=st.lists(st.integers(0, 40), max_size=10), skip=st.booleans())
def test_emitted_text_is_always_a_prefix_of_the_decode_so_far(ids, cuts, skip):
    d = IncrementalDetokenizer(TOK, skip_special_tokens=skip)
    seen, emitted = [], ""
    for c in chunked(ids, cuts):
        seen.extend(c)
        emitted += d.push(c)
        assert TOK.decode(seen, skip_special_tokens=skip).startswith(emitted)


@FAST
@given(text=texts, cuts=st.lists(st.integers(0, 60), max_size=12), skip=st.booleans())
def test_valid_text_never_emits_a_broken_character(text, cuts, skip):
    ids = TOK.encode(text, add_special_tokens=False)
    deltas, tail = stream(ids, cuts, skip)
    assert not any("\ufffd" in d for d in deltas + [tail])
    assert "".join(deltas) + tail == TOK.decode(ids, skip_special_tokens=skip)
    if not skip:
        assert "".join(deltas) + tail == text


@FAST
@given(prompt=texts, text=texts, one_by_one=st.booleans())
def test_seeded_with_prompt_tail_gives_the_continuation(prompt, text, one_by_one):
    p_ids = TOK.encode(prompt, add_special_tokens=True)
    ids = TOK.encode(text, add_special_tokens=False)
    d = IncrementalDetokenizer(TOK, prompt_ids=p_ids)
    deltas = [d.push([i]) for i in ids] if one_by_one else [d.push(ids)]
    out = "".join(deltas) + d.flush()
    full, head = TOK.decode(p_ids + ids), TOK.decode(p_ids)
    assert full.startswith(head)
    assert out == full[len(head):]


def test_multibyte_character_is_held_until_complete():
    ids = TOK.encode("你", add_special_tokens=False)
    assert len(ids) >= 2  # the demo vocabulary splits CJK into byte tokens
    d = IncrementalDetokenizer(TOK)
    assert [d.push([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert d.has_pending
    assert d.push(ids[-1:]) == "你"
    assert not d.has_pending and d.flush() == ""


def test_incomplete_character_at_end_is_flushed_as_replacement():
    ids = TOK.encode("😀", add_special_tokens=False)
    d = IncrementalDetokenizer(TOK)
    assert d.push(ids[:1]) == ""
    assert d.flush() == TOK.decode(ids[:1]) == "\ufffd"


def test_leading_spaces_are_kept_token_by_token():
    ids = TOK.encode("def f(x):\n    return  x  +  1", add_special_tokens=False)
    d = IncrementalDetokenizer(TOK)
    assert "".join(d.push([i]) for i in ids) == "def f(x):\n    return  x  +  1"


def test_skip_special_tokens_both_ways():
    ids = [TOK.token_to_id("<|assistant|>")] + TOK.encode(" ok", add_special_tokens=False) + [TOK.eos_token_id]
    skip = IncrementalDetokenizer(TOK, skip_special_tokens=True)
    keep = IncrementalDetokenizer(TOK, skip_special_tokens=False)
    assert "".join(skip.push([i]) for i in ids) + skip.flush() == " ok"
    assert "".join(keep.push([i]) for i in ids) + keep.flush() == "<|assistant|> ok<|eos|>"


def test_window_stays_bounded_for_long_outputs():
    ids = TOK.encode("x = 1\n" * 500, add_special_tokens=False)
    d = IncrementalDetokenizer(TOK)
    out = "".join(d.push([i]) for i in ids)
    assert out == "x = 1\n" * 500 and d.num_tokens == len(ids)
    assert len(d._window) <= 8


def test_sentencepiece_style_decoder_keeps_the_space_a_lone_decode_strips():
    """Metaspace decoders strip the first token's space: decoding tokens one by one loses it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    t = Tokenizer(models.WordLevel({"[UNK]": 0, "\u2581Hello": 1, "\u2581world": 2, "!": 3}, unk_token="[UNK]"))
    t.pre_tokenizer, t.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    assert t.decode([2]) == "world"  # the naive per-token decode
    d = IncrementalDetokenizer(t)
    assert [d.push([i]) for i in (1, 2, 3, 2)] == ["Hello", " world", "!", " world"]
    seeded = IncrementalDetokenizer(t, prompt_ids=[1])  # exclude_input_in_output: the prompt was "Hello"
    assert seeded.push([2]) == " world"


def test_bad_context_size():
    with pytest.raises(ValueError, match="context_tokens"):
        IncrementalDetokenizer(TOK, context_tokens=-1)
