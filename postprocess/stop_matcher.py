"""Text-level stop strings over a stream of text deltas.

Stops are matched on the decoded text, so a stop spanning several tokens, or ending in the middle
of a token, is found however the model happened to tokenize it. The matcher holds back only the
longest suffix of the text that could still begin a stop string; everything before it is safe
to emit.

Which stop wins: the output ends at the first point in the text where some stop string is
complete (the earliest match *end*); among stops complete at that point, the longest one (the
earliest start). That is the rule a streaming client can observe, and ``stop_text_reference``
states it for whole strings. Unless ``include_stop``, the stop text itself is trimmed.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence


class StopResult(NamedTuple):
    text: str       # text safe to emit now
    matched: bool   # a stop string has matched (now or earlier): the sequence is finished


def _earliest_match(text: str, stops: Sequence[str]) -> tuple[int, int, str] | None:
    """(start, end, stop) of the match with the smallest end; ties go to the longest stop."""
    best: tuple[int, int, str] | None = None
    for s in stops:
        i = text.find(s)
        if i < 0:
            continue
        end = i + len(s)
        if best is None or end < best[1] or (end == best[1] and i < best[0]):
            best = (i, end, s)
    return best


def _partial_suffix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
    n = len(text)
    best = 0
    for s in stops:
        # Suffixes longer than `best` only; a proper prefix is at most len(s) - 1 long.
        for j in range(max(0, n - len(s) + 1), n - best):
            if text[j] == s[0] and s.startswith(text[j:]):
                best = n - j
                break
    return best


class StopMatcher:
    """``push(delta) -> StopResult(text_to_emit, matched)``; ``flush()`` returns held-back text.

    After a match every ``push`` returns ``("", True)`` and ``flush`` returns "".
    """

    __slots__ = ("_stops", "_include", "_held", "stop", "_max_hold")

    def __init__(self, stop_strings: Sequence[str], include_stop: bool = False) -> None:
        stops = tuple(dict.fromkeys(stop_strings))
        if not all(isinstance(s, str) and s for s in stops):
            raise ValueError("stop: every stop string must be a non-empty string")
        self._stops = stops
        self._include = include_stop
        self._held = ""
        self.stop: str | None = None  # the stop string that matched
        self._max_hold = max((len(s) - 1 for s in stops), default=0)

    @property
    def matched(self) -> bool:
        return self.stop is not None

    @property
    def stops(self) -> tuple[str, ...]:
        return self._stops

    @property
    def held(self) -> str:
        """Text held back because it could still begin a stop string."""
        return self._held

    def push(self, text: str) -> StopResult:
        if self.stop is not None:
            return StopResult("", True)
        if not self._stops:
            return StopResult(text, False)
        if not text:
            return StopResult("", False)
        buf = self._held + text
        m = _earliest_match(buf, self._stops)
        if m is not None:
            start, end, stop = m
            self.stop = stop
            self._held = ""
            return StopResult(buf[:end] if self._include else buf[:start], True)
        # Only the last `_max_hold` characters can begin a stop string.
        tail_from = max(0, len(buf) - self._max_hold)
        hold = _partial_suffix_len(buf[tail_from:], self._stops)
        cut = len(buf) - hold
        self._held = buf[cut:]
        return StopResult(buf[:cut], False)

    def flush(self) -> str:
        """End of stream without a match: release the held-back text."""
        out, self._held = self._held, ""
        return "" if self.stop is not None else out


def stop_text_reference(text: str, stop_strings: Sequence[str], include_stop: bool = False) -> tuple[str, bool]:
    """What a whole ``text`` becomes under ``stop_strings``: the specification ``StopMatcher`` streams."""
    m = _earliest_match(text, [s for s in stop_strings if s])
    if m is None:
        return text, False
    start, end, _ = m
    return (text[:end] if include_stop else text[:start]), True
