"""Incremental detokenization of one sequence's token stream (the vLLM / TGI offset technique).

Decoding each new token alone loses leading spaces (SentencePiece decoders strip the first
token's space) and splits multi-byte UTF-8 characters into U+FFFD. Instead keep two offsets into
the token list: ``prefix_offset`` .. ``read_offset`` is a short window of tokens already emitted,
decoded again as context; the delta is ``decode(tokens[prefix:]) - decode(tokens[prefix:read])``.
Text that ends in U+FFFD (an incomplete UTF-8 sequence) is held back until a later token
completes it, or until ``flush()`` at the end of the stream. The concatenation of every delta
plus the flush equals ``decode(all_tokens)``.
"""
from __future__ import annotations

from typing import Protocol, Sequence

REPLACEMENT = "\ufffd"
DEFAULT_CONTEXT_TOKENS = 5


class TextDecoder(Protocol):
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Per-sequence state. ``push(new_ids) -> delta``; ``flush() -> held-back text`` at the end.

    ``prompt_ids`` (e.g. the prompt's last few tokens) seed the context window; they are never
    emitted. Only the last ``context_tokens`` of them are kept. Memory is bounded by the window:
    tokens before ``prefix_offset`` are dropped.
    """

    __slots__ = ("_decoder", "_skip", "_window", "_read", "num_tokens")

    def __init__(self, decoder: TextDecoder, *, skip_special_tokens: bool = True,
                 prompt_ids: Sequence[int] = (), context_tokens: int = DEFAULT_CONTEXT_TOKENS) -> None:
        if context_tokens < 0:
            raise ValueError("context_tokens: must be >= 0")
        self._decoder = decoder
        self._skip = skip_special_tokens
        # _window = tokens[prefix_offset:]; _read = read_offset - prefix_offset.
        self._window: list[int] = list(prompt_ids)[-context_tokens:] if context_tokens else []
        self._read = len(self._window)
        self.num_tokens = 0  # output tokens pushed so far

    @property
    def has_pending(self) -> bool:
        """Whether pushed tokens are not yet reflected in emitted text (held back)."""
        return self._read < len(self._window)

    def push(self, new_token_ids: Sequence[int]) -> str:
        """Append tokens; return the newly complete text (possibly "")."""
        if not len(new_token_ids):
            return ""
        self._window.extend(new_token_ids)
        self.num_tokens += len(new_token_ids)
        return self._step(final=False)

    def flush(self) -> str:
        """End of stream: return any held-back text as is (an incomplete character decodes to U+FFFD)."""
        return self._step(final=True)

    def _step(self, final: bool) -> str:
        window, read = self._window, self._read
        if read == len(window):
            return ""
        prefix_text = self._decoder.decode(window[:read], skip_special_tokens=self._skip) if read else ""
        new_text = self._decoder.decode(window, skip_special_tokens=self._skip)
        if not final and (len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT)):
            # Nothing new yet (skipped special tokens), or a character still incomplete: keep the
            # window, so the next decode sees the whole pending byte sequence.
            return ""
        # prefix_offset <- read_offset; read_offset <- len(tokens)
        del window[:read]
        self._read = len(window)
        return new_text[len(prefix_text):]
