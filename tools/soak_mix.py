"""The soak test's seeded request mix: prompts of varied length cut from the held-out stdlib source,
greedy and sampled requests, a share the client cancels mid-stream and a share of bad inputs, each with
the field its error must name (``make_plans``)."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# (inputs changed from a good request, the field the error message must start with)
BAD_INPUTS = (
    ({"top_p": 2.0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"text_input": ""}, "text_input"),
    ({"temperature": -1.0}, "temperature"),
    ({"max_tokens": 100000}, "max_tokens"),             # prompt + max_tokens beyond the context: the engine's error
    ({"messages": "[{oops", "text_input": None}, "messages"),
    ({"num_return_sequences": 0}, "num_return_sequences"),
    ({"stop_words": [""]}, "stop_words"),
)
# inputs Triton itself rejects before our code (another datatype, an unknown input): off by default, since
# Triton 2.51 then keeps the ensemble live until shutdown (docs/serving.md); --triton-rejected-share measures it
TRITON_REJECTED = (
    ({"max_tokens": ("INT64", 16)}, r"data-type is 'INT64', but model 'ensemble' expects 'INT32'"),
    ({"foo": ("INT32", 1)}, r"unexpected inference input 'foo'"),
)


@dataclass
class Plan:
    """One request of the soak: its ensemble inputs and what the client does with it."""

    index: int
    values: dict[str, Any]
    kind: str                        # "greedy", "sampled", "cancel", "bad"
    cancel_after: int = 0            # responses to read before cancelling (kind "cancel")
    error_field: str | None = None   # kind "bad": the field the error must name
    error_regex: str | None = None   # kind "bad_triton": what Triton's own error says
    raw: dict[str, tuple[str, Any]] = field(default_factory=dict)   # inputs sent with their own datatype


def prompt_texts(n: int, rng: random.Random, min_chars: int = 20, max_chars: int = 1500) -> list[str]:
    """``n`` code snippets of varied length (log-uniform in characters) from the stdlib source."""
    from bench.harness.corpus import corpus_files

    train, heldout = corpus_files(include_tests=False)
    files = heldout or train
    texts = []
    cache: dict[Path, str] = {}
    while len(texts) < n:
        f = files[rng.randrange(len(files))]
        text = cache.setdefault(f, f.read_text(errors="replace"))
        if len(text) < min_chars:
            continue
        size = int(round(2 ** rng.uniform(min_chars.bit_length() - 1, max_chars.bit_length() - 1)))
        size = max(min_chars, min(size, len(text), max_chars))
        start = rng.randrange(0, len(text) - size + 1)
        snippet = text[start:start + size]
        if snippet.strip():
            texts.append(snippet)
    return texts


def make_plans(n: int, *, seed: int, cancel_share: float, bad_share: float, sampled_share: float,
               max_tokens: tuple[int, int], triton_rejected_share: float = 0.0,
               cancel_after_final_share: float = 0.0) -> list[Plan]:
    rng = random.Random(seed)
    texts = prompt_texts(n, rng)
    plans = []
    for i, text in enumerate(texts):
        values: dict[str, Any] = {"text_input": text, "max_tokens": rng.randint(*max_tokens), "stream": True,
                                  "exclude_input_in_output": True, "return_num_output_tokens": True}
        r = rng.random()
        if triton_rejected_share and rng.random() < triton_rejected_share:
            change, pattern = TRITON_REJECTED[rng.randrange(len(TRITON_REJECTED))]
            raw = dict(change)
            for k in raw:
                values.pop(k, None)
            plans.append(Plan(i, values, "bad_triton", error_regex=pattern, raw=raw))
            continue
        if r < bad_share:
            change, fld = BAD_INPUTS[rng.randrange(len(BAD_INPUTS))]
            for k, v in change.items():
                if v is None:
                    values.pop(k, None)
                else:
                    values[k] = v
            plans.append(Plan(i, values, "bad", error_field=fld))
            continue
        sampled = rng.random() < sampled_share
        if sampled:
            values.update(temperature=rng.choice([0.7, 1.0]), top_p=rng.choice([0.9, 1.0]), seed=rng.randrange(2**32))
        else:
            values.update(temperature=0.0, repetition_penalty=rng.choice([1.0, 1.2]))
        if r < bad_share + cancel_share:
            values["max_tokens"] = max(values["max_tokens"], 32)     # long enough to be cancelled mid-stream
            plans.append(Plan(i, values, "cancel", cancel_after=rng.randint(1, 3)))
        elif cancel_after_final_share and rng.random() < cancel_after_final_share:
            plans.append(Plan(i, values, "cancel_after_final"))
        else:
            plans.append(Plan(i, values, "sampled" if sampled else "greedy"))
    return plans
