"""postprocess.processor + state: per-response deltas, stop strings, finish reasons, request state."""
from __future__ import annotations

import enum
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.output_options import OutputOptions
from postprocess.processor import Postprocessor, normalize_finish_reason
from postprocess.state import RequestStateTable
from postprocess.stop_matcher import stop_text_reference
from preprocess.request import RequestParser
from preprocess.tokenizer import load_tokenizer
from tests.helpers.checkpoints import DEMO_TARGET  # noqa: E402

DEMO = DEMO_TARGET
TOK = load_tokenizer(DEMO)


def enc(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def opts(**kw) -> str:
    kw.setdefault("exclude_input_in_output", True)
    return OutputOptions(**kw).to_json()


def feed(pp: Postprocessor, rid: str, responses: list[list[int]], options: str, final_reason="length",
         seq_index: int = 0):
    outs = []
    for i, ids in enumerate(responses):
        last = i == len(responses) - 1
        outs.append(pp.process(rid, ids, is_final=last, finish_reason=final_reason if last else None,
                               options_json=options if i == 0 else None, seq_index=seq_index))
    return outs


def test_stop_string_across_tokens_stops_the_engine_once():
    ids = enc("x = 1\nreturn x\n\ndef g():\n    pass")
    pp = Postprocessor(TOK)
    outs = feed(pp, "r", [[t] for t in ids], opts(stop=("\n\n",)), final_reason="abort")
    assert "".join(o.text for o in outs) == "x = 1\nreturn x"
    hit = next(i for i, o in enumerate(outs) if o.finished)
    assert outs[hit].stop_engine and outs[hit].finish_reason == "stop"
    assert sum(o.stop_engine for o in outs) == 1
    assert all(o.text == "" and o.finish_reason == "stop" and o.num_accepted_tokens == 0 for o in outs[hit + 1:])
    assert outs[-1].finish_reason == "stop"  # the engine's "abort" after our stop request is not reported
    assert all(o.finish_reason is None for o in outs[:hit])
    assert outs[-1].num_output_tokens == hit + 1
    assert len(pp.table) == 0 and pp.stats().dropped == 1


def test_multi_token_responses_count_accepted_tokens():
    ids = enc("alpha beta STOP gamma delta")
    stop_tok = next(i for i in range(len(ids)) if "STOP" in TOK.decode(ids[: i + 1]))
    responses = [ids[i:i + 4] for i in range(0, len(ids), 4)]
    outs = feed(Postprocessor(TOK), "r", responses, opts(stop=("STOP",)))
    assert "".join(o.text for o in outs) == "alpha beta "
    hit = next(o for o in outs if o.finished)
    assert hit.num_accepted_tokens == stop_tok % 4 + 1
    assert hit.num_output_tokens == stop_tok + 1


def test_include_stop_str_in_output():
    ids = enc("a = [1, 2]\n]]] tail")
    outs = feed(Postprocessor(TOK), "r", [[t] for t in ids], opts(stop=("]]]",), include_stop_str_in_output=True))
    assert "".join(o.text for o in outs) == "a = [1, 2]\n]]]"


@pytest.mark.parametrize("reason, expected", [
    ("length", "length"), ("stop", "stop"), ("error", "error"), ("cancelled", "cancelled"),
    (b"abort", "abort"), ("LENGTH ", "length"), ("", None), (None, None),
])
def test_engine_finish_reason_passes_through(reason, expected):
    outs = feed(Postprocessor(TOK), "r", [enc("ok"), enc(" done")], opts(), final_reason=reason)
    assert outs[-1].finished and outs[-1].finish_reason == expected
    assert outs[0].finish_reason is None and not outs[0].finished


def test_finish_reason_enum_and_guided_length():
    class Reason(str, enum.Enum):
        LENGTH = "length"

    assert normalize_finish_reason(Reason.LENGTH) == "length"
    outs = feed(Postprocessor(TOK), "r", [enc('{"a": 1')], opts(guide_type="json"), final_reason=Reason.LENGTH)
    assert outs[-1].finish_reason == "length" and outs[-1].options.guide_type == "json"


SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})


@pytest.mark.parametrize("kind, guide, text, reason, error", [
    ("json_schema", SCHEMA, '{"a": 1}', "stop", None),
    ("json_schema", SCHEMA, '{"a": "x"}', "stop", "does not match the schema at /a"),
    ("json", "", '{"a": 1', "stop", "not valid JSON"),
    ("json", "", '{"a": 1', "length", None),                      # cut by max_tokens: partial, says length
    ("regex", "[0-9]+", "12a", "stop", "does not match the regular expression"),
    ("ebnf_grammar", 'root ::= "x"+', "xx", "stop", None),
])
def test_finished_guided_outputs_are_checked(kind, guide, text, reason, error):
    pp = Postprocessor(TOK)
    ids = enc(text)
    outs = feed(pp, "g", [ids[:2], ids[2:] + [1]], opts(guide_type=kind, guide=guide), final_reason=reason)
    assert outs[-1].finish_reason == reason and "".join(o.text for o in outs) == text
    assert outs[0].error is None
    if error is None:
        assert outs[-1].error is None and pp.num_invalid_guided == 0
    else:
        assert outs[-1].error.startswith("guided_decoding_guide: internal error: the finished output " + error)
        assert pp.num_invalid_guided == 1


def test_prompt_text_prefixes_first_delta_when_input_is_included():
    prompt = TOK.encode("say STOP then", add_special_tokens=True)
    o = opts(exclude_input_in_output=False, prompt_token_ids=tuple(prompt), stop=("STOP",),
             num_input_tokens=len(prompt))
    outs = feed(Postprocessor(TOK), "r", [enc(" fine"), enc(" ok")], o)
    assert outs[0].text == "say STOP then fine"  # BOS skipped; stop strings ignore the prompt
    assert outs[1].text == " ok" and outs[1].finish_reason == "length"
    assert outs[0].num_input_tokens == len(prompt)
    keep = opts(exclude_input_in_output=False, prompt_token_ids=tuple(prompt), skip_special_tokens=False)
    assert feed(Postprocessor(TOK), "r", [enc(" x")], keep)[0].text == "<|bos|>say STOP then x"


def test_prompt_tail_seeds_the_detokenizer():
    prompt = TOK.encode("print(", add_special_tokens=True)
    outs = feed(Postprocessor(TOK), "r", [[t] for t in enc(" 'hi')")], opts(prompt_token_ids=tuple(prompt[-8:])))
    assert "".join(o.text for o in outs) == " 'hi')"


def test_stop_on_the_final_response_does_not_ask_to_stop():
    outs = feed(Postprocessor(TOK), "r", [enc("one"), enc(" two END")], opts(stop=("END",)), final_reason="length")
    assert [o.text for o in outs] == ["one", " two "]
    assert outs[-1].finish_reason == "stop" and not any(o.stop_engine for o in outs)


def test_held_back_text_and_broken_characters_are_released_at_the_end():
    ids = enc("line\n") + enc("😀")[:1]
    outs = feed(Postprocessor(TOK), "r", [[t] for t in ids], opts(stop=("\n\n",)))
    texts = [o.text for o in outs]
    assert "".join(texts[:-1]) == "line"  # "\n" held: it could begin "\n\n"; the emoji byte is incomplete
    assert texts[-1] == "\n\ufffd"


def test_n_sequences_stop_engine_only_when_all_finished():
    pp = Postprocessor(TOK)
    o = opts(stop=("!",), n=2)
    a = pp.process("r", enc("hi!"), is_final=False, options_json=o, seq_index=0)
    assert a.finished and a.text == "hi" and not a.stop_engine  # sequence 1 still running
    b = pp.process("r", enc("yo"), is_final=False, options_json=o, seq_index=1)
    assert b.text == "yo" and not b.finished
    c = pp.process("r", enc(" there!"), is_final=False, seq_index=1)
    assert c.text == " there" and c.stop_engine
    pp.process("r", [], is_final=True, finish_reason="abort", seq_index=0)
    assert "r" in pp.table  # still waiting for sequence 1's final
    d = pp.process("r", [], is_final=True, finish_reason="abort", seq_index=1)
    assert d.finish_reason == "stop" and "r" not in pp.table


def test_requests_are_independent():
    pp = Postprocessor(TOK)
    pp.process("a", enc("aa"), is_final=False, options_json=opts(stop=("X",)))
    pp.process("b", enc("bbX"), is_final=False, options_json=opts())
    assert pp.process("a", enc("X"), is_final=False).finished
    assert not pp.process("b", enc("X"), is_final=False).finished


def test_missing_options_fall_back_to_defaults():
    pp = Postprocessor(TOK)
    out = pp.process("r", enc("text"), is_final=True, finish_reason="stop")
    assert out.text == "text" and pp.requests_without_options == 1 and len(pp.table) == 0


def test_bad_options_json_raises():
    with pytest.raises(ValueError, match="output options"):
        Postprocessor(TOK).process("r", [1], is_final=False, options_json="{nope")
    with pytest.raises(ValueError, match="version"):
        Postprocessor(TOK).process("r", [1], is_final=False, options_json='{"v": 99}')


def test_state_table_is_lru_bounded():
    pp = Postprocessor(TOK, max_requests=2)
    for rid in ("a", "b", "c"):
        pp.process(rid, enc("x"), is_final=False, options_json=opts())
    assert len(pp.table) == 2 and "a" not in pp.table and pp.stats().evicted == 1
    pp.process("b", enc("y"), is_final=False)  # touch b: c is now least recent
    pp.process("d", enc("z"), is_final=False, options_json=opts())
    assert "b" in pp.table and "c" not in pp.table
    t = RequestStateTable(1)
    assert t.drop("missing") is None
    with pytest.raises(ValueError):
        RequestStateTable(0)


def test_preprocess_options_reach_postprocess():
    parser = RequestParser(TOK)
    req = parser.parse({"text_input": np.array([[b"def f():"]], dtype=object),
                        "max_tokens": np.array([[8]], dtype=np.int32),
                        "stop_words": np.array([[b"\n\n"]], dtype=object),
                        "exclude_input_in_output": np.array([[True]])})
    outs = feed(Postprocessor(TOK), "r", [[t] for t in enc("\n    return 1\n\nx")], req.options_json(), "abort")
    assert "".join(o.text for o in outs) == "\n    return 1"
    assert outs[-1].finish_reason == "stop"


ALPHABET = st.sampled_from(list("ab \n") + ["好", "😀", "<|end|>"])


@settings(max_examples=60, deadline=None)
@given(text=st.lists(ALPHABET, max_size=20).map("".join),
       stops=st.lists(st.text(alphabet="ab \n好", min_size=1, max_size=3), max_size=3),
       sizes=st.lists(st.integers(1, 4), min_size=1, max_size=8), include=st.booleans())
def test_streamed_output_equals_decode_then_cut(text, stops, sizes, include):
    ids = enc(text)
    responses, i = [], 0
    while i < len(ids):
        n = sizes[len(responses) % len(sizes)]
        responses.append(ids[i:i + n])
        i += n
    responses = responses or [[]]
    outs = feed(Postprocessor(TOK), "r", responses, opts(stop=tuple(stops), include_stop_str_in_output=include))
    expected, matched = stop_text_reference(TOK.decode(ids), stops, include)
    assert "".join(o.text for o in outs) == expected
    assert outs[-1].finish_reason == ("stop" if matched else "length")
    assert sum(o.stop_engine for o in outs) <= 1
