"""xgrammar behind the engine's structured-output interface: compile (cached), and a matcher per sequence.

The engine defines the interface (``backend/structured_output/interface.py``) and its builder hands
it an ``XGrammarBackend``; this module never imports the engine. Thread-safety: ``compile`` runs on
the engine's compile pool (any thread); a matcher is used by the engine loop thread only.

Tokenizer: xgrammar needs every token's bytes. ``tokenizer_info_from_folder`` reads them from the
checkpoint's ``tokenizer.json`` and blanks the special added tokens (BOS, PAD, chat markers), so a
grammar never admits them: the detokenizer drops them (``skip_special_tokens``), and the text the
grammar saw would differ from the text the client gets. The stop tokens are the engine's EOS ids:
the grammar admits them exactly where it may end.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import xgrammar as xgr

from grammar.errors import GUIDE, GuideError
from grammar.guides import PreparedGuide, prepare_guide, xgrammar_message
from grammar.nesting import MAX_PARSE_DEPTH

LAYER_VERSION = "1"    # part of the tokenizer identity: bump when the vocabulary handling changes
DEFAULT_CACHE_BYTES = 256 << 20


def tokenizer_info_from_folder(folder: str | Path, vocab_size: int,
                               stop_token_ids: Sequence[int]) -> tuple[xgr.TokenizerInfo, str]:
    """(xgrammar's view of the checkpoint's tokenizer, its identity for cache keys).

    ``vocab_size`` is the model's (the logits' width); ids past the tokenizer's vocabulary are
    never admitted. Reads ``tokenizer.json``; without one, falls back to transformers' tokenizer.
    """
    folder = Path(folder)
    stops = sorted({int(t) for t in stop_token_ids})
    if not stops:
        raise ValueError("stop_token_ids: guided decoding needs at least one EOS id")
    path = folder / "tokenizer.json"
    h = hashlib.sha256(f"{LAYER_VERSION}|{vocab_size}|{stops}|".encode())
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        h.update(text.encode())
        info = _info_from_tokenizer_json(text, vocab_size, stops)
    else:
        from transformers import AutoTokenizer  # xgrammar imports transformers anyway

        tok = AutoTokenizer.from_pretrained(str(folder))
        h.update(json.dumps(sorted(tok.get_vocab().items())).encode())
        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab_size, stop_token_ids=stops)
    return info, h.hexdigest()[:24]


def _info_from_tokenizer_json(text: str, vocab_size: int, stops: list[int]) -> xgr.TokenizerInfo:
    spec = json.loads(text)
    model = spec.get("model") or {}
    vocab = model.get("vocab")
    encoded = [""] * vocab_size
    if isinstance(vocab, dict):                  # BPE, WordPiece, WordLevel: token -> id
        items = vocab.items()
    elif isinstance(vocab, list):                # Unigram: [[piece, score], ...] in id order
        items = ((entry[0], i) for i, entry in enumerate(vocab))
    else:
        raise ValueError("tokenizer.json: no model.vocab")
    for token, i in items:
        if 0 <= i < vocab_size:
            encoded[i] = token
    for added in spec.get("added_tokens") or []:
        i = added.get("id", -1)
        if 0 <= i < vocab_size:
            encoded[i] = "" if added.get("special") else added.get("content", "")
    meta = xgr.TokenizerInfo._detect_metadata_from_hf(text)   # the detection from_huggingface uses
    return xgr.TokenizerInfo(encoded, meta["vocab_type"], vocab_size=vocab_size, stop_token_ids=stops,
                             add_prefix_space=meta["add_prefix_space"])


@dataclass(frozen=True)
class CompiledGuide:
    """A compiled grammar and what it was compiled from (``key``: guide type, text, tokenizer)."""

    key: tuple[str, str, str]
    grammar: xgr.CompiledGrammar
    compile_s: float


@dataclass(frozen=True)
class CacheStats:
    entries: int
    bytes: int
    hits: int
    misses: int


class XGrammarMatcher:
    """One sequence's grammar state (the engine's ``GrammarMatcher``).

    The engine calls a matcher on every step of a guided request, so the calls are lean: xgrammar's
    methods are bound once, and ``is_terminated`` is answered here without a call into xgrammar. A
    matcher built without ``terminate_without_stop_token`` (as here) terminates exactly when it accepts
    one of its stop tokens, and it accepts nothing after one, so a rollback of one token or more undoes
    the termination (``tests/grammar/test_backend.py`` checks this against xgrammar).
    """

    def __init__(self, compiled: CompiledGuide, stop_token_ids: frozenset[int]):
        self._m = xgr.GrammarMatcher(compiled.grammar)
        self._accept = self._m.accept_token
        self._rollback = self._m.rollback
        self._fill = self._m.fill_next_token_bitmask
        self._stops = stop_token_ids
        self._terminated = False

    def _accept_one(self, t: int) -> bool:
        if self._terminated or not self._accept(t):   # xgrammar warns when a terminated matcher is asked
            return False
        self._terminated = t in self._stops
        return True

    def accept_tokens(self, tokens: Sequence[int]) -> bool:
        """Advance through ``tokens``; on a rejected token undo the ones taken and return False."""
        for n, t in enumerate(tokens):
            if not self._accept_one(int(t)):
                self.rollback(n)
                return False
        return True

    def validate_tokens(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar admits from here; the state is left unchanged."""
        n = 0
        for t in tokens:
            if not self._accept_one(int(t)):
                break
            n += 1
        self.rollback(n)
        return n

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self._rollback(num_tokens)
            self._terminated = False

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Row ``row`` of ``bitmask`` (int32, on the CPU) gets the tokens admitted next."""
        self._fill(bitmask, row)

    def is_terminated(self) -> bool:
        return self._terminated

    def jump_forward_tokens(self) -> list[int]:
        """Tokens the grammar forces from here (xgrammar's greedy tokenisation of the forced text)."""
        return self._m.find_jump_forward_tokens()


class XGrammarBackend:
    """Compiles guides for one tokenizer (the engine's ``StructuredOutputBackend``).

    The cache is keyed by (guide type, guide text, tokenizer identity) and bounded by the compiled
    grammars' memory (least recently used out first); xgrammar's own cache is off, so there is one.
    """

    def __init__(self, tokenizer_info: xgr.TokenizerInfo, tokenizer_identity: str, *, max_threads: int = 2,
                 cache_bytes: int = DEFAULT_CACHE_BYTES, fill_threads: int | str = 1):
        self.tokenizer_info = tokenizer_info
        self.tokenizer_identity = tokenizer_identity
        self.vocab_size = tokenizer_info.vocab_size
        self._compiler = xgr.GrammarCompiler(tokenizer_info, max_threads=max_threads, cache_enabled=False)
        self._cache: OrderedDict[tuple[str, str, str], CompiledGuide] = OrderedDict()
        self._cache_bytes = 0
        self._cache_limit = cache_bytes
        self._lock = threading.Lock()
        self._hits = self._misses = 0
        self._batch: xgr.BatchGrammarMatcher | None = None   # built on first use, by the step's thread
        self._fill_threads = fill_threads                     # xgrammar's threads for batched fills ("auto": half)
        self._stop_token_ids = frozenset(tokenizer_info.stop_token_ids)

    @classmethod
    def from_folder(cls, folder: str | Path, vocab_size: int, stop_token_ids: Sequence[int],
                    **kwargs) -> "XGrammarBackend":
        info, identity = tokenizer_info_from_folder(folder, vocab_size, stop_token_ids)
        return cls(info, identity, **kwargs)

    def cache_key(self, kind: str, guide: str) -> tuple[str, str, str]:
        return (kind, "" if kind == "json" else guide, self.tokenizer_identity)

    def cached(self, kind: str, guide: str) -> CompiledGuide | None:
        """The compiled guide if it is in the cache (counts as a hit), else None."""
        key = self.cache_key(kind, guide)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self._hits += 1
            return hit

    def compile(self, kind: str, guide: str) -> CompiledGuide:
        """Compile (or fetch) a guide; ``GuideError`` naming the field when it cannot be compiled."""
        hit = self.cached(kind, guide)
        if hit is not None:
            return hit
        # preprocess enforced its size and depth settings already: here only the parsers' own bound applies
        prepared = prepare_guide(kind, guide, max_chars=len(guide or ""), max_depth=MAX_PARSE_DEPTH)
        start = time.perf_counter()
        grammar = self._compile(prepared)
        compiled = CompiledGuide(self.cache_key(kind, guide), grammar, time.perf_counter() - start)
        with self._lock:
            self._misses += 1
            if compiled.key not in self._cache:
                self._cache[compiled.key] = compiled
                self._cache_bytes += grammar.memory_size_bytes
                while self._cache_bytes > self._cache_limit and len(self._cache) > 1:
                    _, old = self._cache.popitem(last=False)
                    self._cache_bytes -= old.grammar.memory_size_bytes
        return compiled

    def _compile(self, g: PreparedGuide) -> xgr.CompiledGrammar:
        try:
            if g.kind == "regex":
                return self._compiler.compile_regex(g.source)
            return self._compiler.compile_grammar(g.source)      # EBNF (JSON guides too: guides.py)
        except Exception as e:
            raise GuideError(GUIDE, f"xgrammar could not compile it: {xgrammar_message(e)}") from None

    def matcher(self, compiled: CompiledGuide) -> XGrammarMatcher:
        return XGrammarMatcher(compiled, self._stop_token_ids)

    def fill_bitmasks(self, matchers: Sequence[XGrammarMatcher], bitmask: torch.Tensor, rows: Sequence[int]) -> None:
        """Row ``rows[i]`` of ``bitmask`` gets what ``matchers[i]`` admits next: one call into xgrammar for
        two or more (on ``fill_threads``; about 1.5-2x faster than a fill per matcher at 32 rows even on one
        thread), a plain fill for one (3x cheaper than the batch call's set-up). Call it from one thread at
        a time (the engine's step)."""
        if len(matchers) == 1:
            matchers[0].fill_bitmask(bitmask, rows[0])
            return
        if self._batch is None:
            self._batch = xgr.BatchGrammarMatcher(self._fill_threads)
        self._batch.batch_fill_next_token_bitmask([m._m for m in matchers], bitmask, list(rows))

    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        """``[num_rows, ceil(vocab / 32)]`` int32 on the CPU, every token allowed."""
        return xgr.allocate_token_bitmask(num_rows, self.vocab_size)

    def cache_stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(len(self._cache), self._cache_bytes, self._hits, self._misses)
