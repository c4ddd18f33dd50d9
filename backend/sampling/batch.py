"""The sampler's per-step state: every row's parameters as tensors, built once per step.

A row is one distribution to sample: normally one per sequence; with speculative decoding
one per verified position (the same sequence repeated, each row with its own output so far,
see ``output_token_ids``). Filters no row uses are ``None``, so the sampler skips them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence as Seq

import torch

from backend.core.sequence import Sequence
from backend.sampling.keyed_draw import DrawKeys

GREEDY_EPS = 1e-5  # temperatures below this are greedy (dividing by them would overflow)


@dataclass
class SamplingBatch:
    num_rows: int
    vocab_size: int
    temperature: torch.Tensor                 # [num_rows] fp32, 1.0 on greedy rows
    greedy: torch.Tensor                      # [num_rows] bool
    greedy_rows: list[bool]                   # the same, on the host
    top_k: torch.Tensor | None = None         # [num_rows] int64 in [1, vocab]; vocab = off
    top_p: torch.Tensor | None = None         # [num_rows] fp32; 1 = off
    min_p: torch.Tensor | None = None         # [num_rows] fp32; 0 = off
    repetition_penalty: torch.Tensor | None = None  # [num_rows] fp32; 1 = off
    presence_penalty: torch.Tensor | None = None    # [num_rows] fp32
    frequency_penalty: torch.Tensor | None = None   # [num_rows] fp32
    prompt_token_ids: torch.Tensor | None = None    # [num_rows, max_prompt] int64 padded with vocab (repetition rows only)
    output_token_ids: torch.Tensor | None = None    # [num_rows, max_output] int64 padded with vocab (penalty rows only)
    bad_word_bans: tuple[torch.Tensor, torch.Tensor] | None = None   # (rows [n], tokens [n]) int64
    min_tokens_bans: tuple[torch.Tensor, torch.Tensor] | None = None  # (rows [n], tokens [n]) int64
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (rows [n], tokens [n]) int64, bias [n] fp32
    grammar_bitmask: torch.Tensor | None = None     # [num_rows, ceil(vocab / 32)] int32; filled by the guide
    keys: DrawKeys = field(default_factory=lambda: DrawKeys([], [], []))   # per row: what its draw is keyed by
    num_logprobs: list[int | None] = field(default_factory=list)            # per row; None: no logprobs

    @property
    def all_greedy(self) -> bool:
        return all(self.greedy_rows)

    @property
    def any_greedy(self) -> bool:
        return any(self.greedy_rows)

    @property
    def has_penalties(self) -> bool:
        return self.output_token_ids is not None

    @property
    def has_masks(self) -> bool:
        return self.grammar_bitmask is not None or self.bad_word_bans is not None or self.min_tokens_bans is not None

    @property
    def argmax_of_raw(self) -> bool:
        """Every row's logits reach the draw as the model gave them, but for a grammar mask: no bans, no
        penalties, no logit bias (a greedy row is then the masked argmax of its raw logits)."""
        return (self.bad_word_bans is None and self.min_tokens_bans is None and not self.has_penalties
                and self.logit_bias is None)

    @property
    def max_num_logprobs(self) -> int | None:
        asked = [n for n in self.num_logprobs if n is not None]
        return max(asked) if asked else None


def is_sampled(seq: Sequence) -> bool:
    """The sequence samples its tokens (a temperature above ``GREEDY_EPS``): its verification draws from filtered
    distributions where a greedy one takes an argmax."""
    return seq.params.temperature >= GREEDY_EPS


def is_plain_greedy(seq: Sequence) -> bool:
    """The sequence's next token is exactly the argmax of its raw logits: greedy, no penalties, no bans
    (bad words, or EOS/stop ids held back by ``min_tokens``), no logit bias, no logprobs. Such rows need no batch."""
    p = seq.params
    return (p.temperature < GREEDY_EPS and p.repetition_penalty == 1.0 and p.presence_penalty == 0.0
            and p.frequency_penalty == 0.0 and not p.bad_words_ids and not p.logit_bias and p.logprobs is None
            and len(seq.output_token_ids) >= p.min_tokens)


def reads_output_ids(seq: Sequence) -> bool:
    """Whether the sequence's filters read its tokens so far: penalties, bad words, a ``min_tokens`` still to reach.
    Only then does a verify step build each of its rows' outputs (the drafts before the row appended)."""
    p = seq.params
    return (p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
            or bool(p.bad_words_ids) or len(seq.output_token_ids) < p.min_tokens)


def bad_word_bans(output: list[int], bad_words: Seq[Seq[int]]) -> list[int]:
    """Tokens to forbid next: the last token of each bad word whose prefix ends the output."""
    banned = []
    for word in bad_words:
        prefix = len(word) - 1
        if prefix == 0 or (len(output) >= prefix and output[len(output) - prefix:] == list(word[:-1])):
            banned.append(word[-1])
    return banned


def pad_rows(rows: list[list[int]], pad: int, device) -> torch.Tensor:  # -> [num_rows, max_len] int64
    """Rows padded with ``pad`` (= vocab size, a bucket the counts drop); ids past it land there too."""
    width = max(1, max(len(r) for r in rows))
    t = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.int64, device=device)
    return t.clamp_(0, pad)


def _bans(pairs: list[tuple[int, int]], vocab: int, device) -> tuple[torch.Tensor, torch.Tensor] | None:
    pairs = [(r, t) for r, t in pairs if 0 <= t < vocab]
    if not pairs:
        return None
    t = torch.tensor(pairs, dtype=torch.int64, device=device)
    return t[:, 0], t[:, 1]


def _biases(params: Seq, vocab: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Every row's ``logit_bias`` as flat (rows, tokens, bias) tensors; ids past the vocabulary are dropped
    (the engine refuses them before a request runs)."""
    rows, tokens, bias = [], [], []
    for i, p in enumerate(params):
        for t, b in p.logit_bias:
            if t < vocab:
                rows.append(i)
                tokens.append(t)
                bias.append(b)
    if not rows:
        return None
    return (torch.tensor(rows, dtype=torch.int64, device=device), torch.tensor(tokens, dtype=torch.int64, device=device),
            torch.tensor(bias, dtype=torch.float32, device=device))


def build_sampling_batch(
    seqs: Seq[Sequence],
    vocab_size: int,
    *,
    eos_token_ids: Seq[int] = (),
    device: torch.device | str = "cpu",
    output_token_ids: Seq[list[int]] | None = None,  # per row, overrides seq.output_token_ids (speculative rows)
    grammar_bitmask: torch.Tensor | None = None,     # [num_rows, ceil(vocab / 32)] int32
    keys: DrawKeys | None = None,                    # per row; None: seed 0, position = the row's output length
) -> SamplingBatch:
    """One row per entry of ``seqs``; tensors only for the features some row uses."""
    n = len(seqs)
    params = [s.params for s in seqs]
    outputs = list(output_token_ids) if output_token_ids is not None else [s.output_token_ids for s in seqs]
    f32 = dict(dtype=torch.float32, device=device)
    greedy_rows = [p.temperature < GREEDY_EPS for p in params]
    batch = SamplingBatch(
        num_rows=n, vocab_size=vocab_size,
        temperature=torch.tensor([1.0 if g else p.temperature for g, p in zip(greedy_rows, params)], **f32),
        greedy=torch.tensor(greedy_rows, dtype=torch.bool, device=device),
        greedy_rows=greedy_rows,
        grammar_bitmask=grammar_bitmask,
        keys=keys if keys is not None else DrawKeys([0] * n, [s.seq_index for s in seqs], [len(o) for o in outputs]),
        num_logprobs=[p.logprobs for p in params],
    )
    if any(0 < p.top_k < vocab_size for p in params):
        batch.top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params],
                                   dtype=torch.int64, device=device)
    if any(p.top_p < 1.0 for p in params):
        batch.top_p = torch.tensor([p.top_p for p in params], **f32)
    if any(p.min_p > 0.0 for p in params):
        batch.min_p = torch.tensor([p.min_p for p in params], **f32)

    rep = [p.repetition_penalty != 1.0 for p in params]
    pf = [p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params]
    if any(rep) or any(pf):
        batch.output_token_ids = pad_rows([list(o) if r or q else [] for o, r, q in zip(outputs, rep, pf)],
                                          vocab_size, device)
        if any(rep):
            batch.repetition_penalty = torch.tensor([p.repetition_penalty for p in params], **f32)
            batch.prompt_token_ids = pad_rows([s.prompt_token_ids if r else [] for s, r in zip(seqs, rep)],
                                              vocab_size, device)
        if any(pf):
            batch.presence_penalty = torch.tensor([p.presence_penalty for p in params], **f32)
            batch.frequency_penalty = torch.tensor([p.frequency_penalty for p in params], **f32)

    eos = tuple(eos_token_ids)
    batch.bad_word_bans = _bans([(i, t) for i, (p, o) in enumerate(zip(params, outputs)) if p.bad_words_ids
                                 for t in bad_word_bans(o, p.bad_words_ids)], vocab_size, device)
    batch.min_tokens_bans = _bans([(i, t) for i, (p, o) in enumerate(zip(params, outputs)) if len(o) < p.min_tokens
                                   for t in p.stop_token_ids + (() if p.ignore_eos else eos)], vocab_size, device)
    if any(p.logit_bias for p in params):
        batch.logit_bias = _biases(params, vocab_size, device)
    return batch
