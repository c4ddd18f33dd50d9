"""Seeded synthetic workloads shared by the benchmarks: real code text from the held-out corpus."""
from __future__ import annotations

import random
from dataclasses import dataclass

from tokenizers import Tokenizer

from tools.corpus import corpus_files, read_text


@dataclass(frozen=True)
class BenchRequest:
    prompt_ids: list[int]
    max_tokens: int


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


def mixed_workload(tok: Tokenizer, n: int, seed: int = 0, prompt_range=(16, 512),
                   output_range=(32, 256)) -> list[BenchRequest]:
    """``n`` requests with uniform prompt lengths and output lengths, prompts cut from held-out code."""
    rng = random.Random(seed)
    ids = corpus_ids(tok, 8192)
    bos = tok.token_to_id("<|bos|>")
    out = []
    for _ in range(n):
        plen = rng.randint(*prompt_range)
        start = rng.randrange(0, len(ids) - plen)
        out.append(BenchRequest([bos] + ids[start:start + plen - 1], rng.randint(*output_range)))
    return out


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
