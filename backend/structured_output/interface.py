"""The interface the engine calls for constrained decoding (as vLLM v1's structured-output backend).

A *backend* compiles guides for one tokenizer; a *matcher* holds one sequence's position in its
grammar. Bitmask layout (xgrammar's): ``[rows, ceil(vocab / 32)]`` int32 on the CPU, bit ``j`` of word
``w`` allows token ``32 * w + j``; all bits set means no constraint. The engine's builder provides
``grammar.XGrammarBackend``; these protocols are structural, so it need not import them.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class GrammarMatcher(Protocol):
    def accept_tokens(self, tokens: Sequence[int]) -> bool:
        """Advance through ``tokens``; if one is rejected, undo the ones taken and return False."""

    def validate_tokens(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar admits from here; the state is left unchanged."""

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens admitted next into ``bitmask[row]``."""

    def is_terminated(self) -> bool:
        """True once the grammar accepted a stop token (the output is complete)."""

    def jump_forward_tokens(self) -> list[int]:
        """Tokens the grammar forces from here (may be empty)."""


@runtime_checkable
class StructuredOutputBackend(Protocol):
    vocab_size: int

    def cached(self, kind: str, guide: str) -> Any | None:
        """The compiled guide if the backend's cache has it, else None (cheap, any thread)."""

    def compile(self, kind: str, guide: str) -> Any:
        """Compile (or fetch from the cache) a guide; blocking and thread-safe. Raises ``ValueError``
        whose message starts with the ensemble input at fault (``guided_decoding_guide: ...``)."""

    def matcher(self, compiled: Any) -> GrammarMatcher:
        """A fresh matcher at the start of the compiled grammar."""

    def fill_bitmasks(self, matchers: Sequence[GrammarMatcher], bitmask: torch.Tensor, rows: Sequence[int]) -> None:
        """``bitmask[rows[i]]`` gets what ``matchers[i]`` admits next, for the whole batch at once
        (matchers of this backend only)."""
