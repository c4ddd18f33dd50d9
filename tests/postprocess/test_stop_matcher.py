"""postprocess.stop_matcher: text-level stop strings over arbitrary chunkings (property tests)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from postprocess.stop_matcher import StopMatcher, StopResult, stop_text_reference

FAST = settings(max_examples=200, deadline=None)
# A small alphabet makes overlaps, repeated prefixes and near-misses common.
small_text = st.text(alphabet="abc\n😀", max_size=30)
stops = st.lists(st.text(alphabet="abc\n😀", min_size=1, max_size=4), min_size=1, max_size=4)
cuts = st.lists(st.integers(0, 40), max_size=10)


def chunks(text: str, positions: list[int]) -> list[str]:
    bounds = sorted({0, len(text), *(p % (len(text) + 1) for p in positions)})
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def run(stop_strings, include, pieces):
    m = StopMatcher(stop_strings, include_stop=include)
    out, matched = [], False
    for p in pieces:
        text, matched = m.push(p)
        out.append(text)
    return "".join(out) + m.flush(), matched, m


def longest_partial_suffix(text: str, stop_strings) -> int:
    return max([k for s in stop_strings for k in range(1, len(s)) if text.endswith(s[:k])] + [0])


@FAST
@given(text=small_text, stop_strings=stops, positions=cuts, include=st.booleans())
def test_streaming_equals_whole_text_reference(text, stop_strings, positions, include):
    out, matched, m = run(stop_strings, include, chunks(text, positions))
    assert (out, matched) == stop_text_reference(text, stop_strings, include)
    assert m.matched == matched


@FAST
@given(text=small_text, stop_strings=stops, positions=cuts)
def test_holds_back_exactly_the_longest_suffix_that_could_begin_a_stop(text, stop_strings, positions):
    m = StopMatcher(stop_strings)
    so_far, emitted = "", ""
    for p in chunks(text, positions):
        so_far += p
        r = m.push(p)
        emitted += r.text
        if r.matched:
            break
        assert emitted + m.held == so_far
        assert len(m.held) == longest_partial_suffix(so_far, stop_strings)
        assert not any(s in emitted for s in stop_strings)


@FAST
@given(text=small_text, stop_strings=stops, positions=cuts)
def test_without_include_no_stop_text_is_ever_emitted(text, stop_strings, positions):
    out, _, _ = run(stop_strings, False, chunks(text, positions))
    assert not any(s in out for s in stop_strings)


def test_stop_spanning_chunks():
    out, matched, m = run(["</answer>"], False, ["42</", "ans", "wer> trailing"])
    assert (out, matched, m.stop) == ("42", True, "</answer>")


def test_stop_ending_mid_chunk_trims_the_rest_of_the_chunk():
    m = StopMatcher(["STOP"])
    assert m.push("xx") == StopResult("xx", False)
    assert m.push("ST") == StopResult("", False)
    assert m.held == "ST"
    assert m.push("OPyy") == StopResult("", True)
    assert m.push("more") == ("", True) and m.flush() == ""


def test_include_stop_both_ways():
    assert run(["STOP"], True, ["xxST", "OPyy"])[0] == "xxSTOP"
    assert run(["STOP"], False, ["xxST", "OPyy"])[0] == "xx"


def test_overlapping_prefix_is_released_as_soon_as_it_cannot_match():
    m = StopMatcher(["aab"])
    assert [m.push(c).text for c in "aaa"] == ["", "", "a"]  # hold at most "aa"
    assert m.push("b") == StopResult("", True)


def test_earliest_end_wins_then_longest():
    # "bc" completes before "abcd" could; with equal ends the longer stop is trimmed.
    assert stop_text_reference("xabcd", ["abcd", "bc"]) == ("xa", True)
    assert stop_text_reference("xab", ["b", "ab"]) == ("x", True)
    assert run(["abcd", "bc"], False, list("xabcd"))[0] == "xa"
    assert run(["b", "ab"], True, list("xab"))[0] == "xab"


def test_no_stops_passes_everything_through():
    m = StopMatcher([])
    assert m.push("abc") == ("abc", False) and m.held == "" and m.flush() == ""


def test_flush_releases_held_text_without_a_match():
    m = StopMatcher(["\n\n"])
    assert m.push("line\n") == ("line", False)
    assert m.flush() == "\n"


def test_empty_stop_string_is_rejected():
    with pytest.raises(ValueError, match="stop"):
        StopMatcher(["ok", ""])
