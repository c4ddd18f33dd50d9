"""Seeded synthetic workloads shared by the benchmarks: real code text from the held-out corpus.

Two kinds of request, both with ``prompt_ids`` and ``params`` (what the in-process driver sends):

- ``BenchRequest``: token ids only, greedy with EOS ignored (engine-level benchmarks);
- ``WorkItem``: text sent to the ensemble plus what preprocess's own ``RequestParser`` makes of it,
  so the pipeline and the in-process engine see token-identical prompts and identical parameters.
"""
from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from tokenizers import Tokenizer

from contracts.sampling_params import SamplingParams
from bench.harness.corpus import corpus_files, read_text


@dataclass(frozen=True)
class BenchRequest:
    prompt_ids: list[int]
    max_tokens: int

    @property
    def params(self) -> SamplingParams:
        """Greedy, EOS ignored: every request produces exactly ``max_tokens``."""
        return SamplingParams(max_tokens=self.max_tokens, temperature=0.0, ignore_eos=True)


@dataclass(frozen=True)
class WorkItem:
    """One request: the text sent to the ensemble and what preprocess makes of it."""

    text: str
    max_tokens: int
    prompt_ids: tuple[int, ...] = ()
    params: Any = None          # contracts.sampling_params.SamplingParams, from preprocess's parser
    extra: Mapping[str, Any] = field(default_factory=dict)  # more ensemble inputs (e.g. a guide)

    def values(self) -> dict[str, Any]:
        """The ensemble inputs of this request."""
        return request_values(self.text, self.max_tokens) | dict(self.extra)


def request_values(text: str, max_tokens: int) -> dict[str, Any]:
    """The ensemble inputs of one benchmark request (TensorRT-LLM names).

    ``min_tokens = max_tokens`` is the API's ignore-EOS: every request produces exactly ``max_tokens``.
    """
    return {"text_input": text, "max_tokens": max_tokens, "stream": True, "temperature": 0.0,
            "min_tokens": max_tokens, "exclude_input_in_output": True, "return_num_output_tokens": True,
            "return_num_input_tokens": True}


def corpus_ids(tok: Tokenizer, min_tokens: int = 4096) -> list[int]:
    """Held-out stdlib code as one token stream (never trained on)."""
    _, heldout = corpus_files(include_tests=False)
    ids: list[int] = []
    for f in heldout:
        text = read_text(f)
        if text:
            ids.extend(tok.encode(text, add_special_tokens=False).ids)
        if len(ids) >= min_tokens:
            break
    return ids


def sample_spans(ids: list[int], n: int, seed: int, prompt_range, output_range) -> Iterator[tuple[list[int], int]]:
    """``n`` seeded (prompt span, max_tokens): spans of ``plen - 1`` ids (BOS makes ``plen``), uniform lengths."""
    rng = random.Random(seed)
    for _ in range(n):
        plen = rng.randint(*prompt_range)
        start = rng.randrange(0, len(ids) - plen)
        span = ids[start:start + plen - 1]
        yield span, rng.randint(*output_range)


def mixed_workload(tok: Tokenizer, n: int, seed: int = 0, prompt_range=(16, 512),
                   output_range=(32, 256)) -> list[BenchRequest]:
    """``n`` requests with uniform prompt lengths and output lengths, prompts cut from held-out code."""
    bos = tok.token_to_id("<|bos|>")
    return [BenchRequest([bos] + span, max_tokens)
            for span, max_tokens in sample_spans(corpus_ids(tok, 8192), n, seed, prompt_range, output_range)]


def shared_stem_workload(tok: Tokenizer, n: int, stem_tokens: int, suffix_tokens: int, max_tokens: int,
                         seed: int = 0) -> list[BenchRequest]:
    """``n`` requests sharing one ``stem_tokens`` prefix, each with its own suffix."""
    rng = random.Random(seed)
    ids = corpus_ids(tok, stem_tokens + n * suffix_tokens + 16)
    bos = tok.token_to_id("<|bos|>")
    stem = [bos] + ids[:stem_tokens - 1]
    rest = ids[stem_tokens:]
    reqs = []
    for i in range(n):
        off = rng.randrange(0, len(rest) - suffix_tokens)
        reqs.append(BenchRequest(stem + rest[off:off + suffix_tokens], max_tokens))
    return reqs


def make_workload(model: Path, n: int, seed: int, prompt_range=(32, 256), output_range=(32, 128),
                  extra: Mapping[str, Any] | None = None) -> list[WorkItem]:
    """``n`` seeded requests: prompts cut from held-out code as text, parsed by preprocess's RequestParser.

    ``extra``: more ensemble inputs for every request (parsed too, so the in-process side gets them).
    """
    from cli.client import to_array

    raw, parser, ids = _workload_tools(str(model))
    extra = dict(extra or {})
    items = []
    for span, max_tokens in sample_spans(ids, n, seed, prompt_range, output_range):
        item = WorkItem(raw.decode(span), max_tokens, extra=extra)
        pre = parser.parse({k: to_array(k, v) for k, v in item.values().items()})
        items.append(WorkItem(item.text, max_tokens, tuple(pre.prompt_token_ids), pre.sampling_params, extra))
    return items


@functools.lru_cache(maxsize=4)
def _workload_tools(model: str):
    """(raw tokenizer, preprocess's RequestParser, held-out corpus ids) for a checkpoint folder."""
    from preprocess import RequestLimits, RequestParser, load_tokenizer
    from preprocess.serving import model_context_length

    raw = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
    ctx = model_context_length(Path(model))
    parser = RequestParser(load_tokenizer(model), RequestLimits(max_model_len=ctx) if ctx else None)
    return raw, parser, corpus_ids(raw, 8192)


def requests_for(concurrency: int, lo: int, hi: int) -> int:
    """Requests at one level: twice the concurrency, within [lo, hi]."""
    return max(lo, min(hi, 2 * concurrency))
