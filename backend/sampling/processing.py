"""The sampler's stateless pipeline over a batch of logits rows, in the documented order: grammar bitmask → bad
words → min_tokens (EOS/stop ids masked) → repetition, presence, frequency penalties → logit bias → temperature →
top-k → top-p → min-p → keyed draw (``keyed_draw.py``). Temperature 0 is greedy: the argmax of the masked,
penalised, biased logits.
Logprobs are of the raw model distribution.

``process_logits`` / ``compute_probs`` expose the processed distribution of arbitrary rows, so that speculative
verification and a draft model's proposals apply exactly the filters of plain sampling.
"""
from __future__ import annotations

import torch

from backend.core.outputs import TokenLogprob
from backend.sampling.batch import SamplingBatch
from backend.sampling.bitmask_kernels import TORCH_KERNELS, BitmaskKernels
from backend.sampling.keyed_draw import TORCH_DRAWS, DrawKernels, DrawRule
from backend.sampling.ops import (
    apply_bans,
    apply_logit_bias,
    apply_min_p,
    apply_penalties,
    apply_temperature,
    apply_top_k_top_p,
    gather_logprobs,
    logits_to_probs,
)


def mask_and_penalise(
    logits: torch.Tensor,   # [num_rows, vocab] raw (not modified)
    batch: SamplingBatch,
    kernels: BitmaskKernels = TORCH_KERNELS,   # how the grammar bitmask is applied
) -> torch.Tensor:          # [num_rows, vocab] fp32, a new tensor
    """A float32 copy with the grammar mask (one pass), then bad words, min_tokens, the penalties, the logit
    bias: what greedy rows take the argmax of."""
    if batch.grammar_bitmask is not None:
        logits = kernels.masked_copy(logits, batch.grammar_bitmask)
    else:
        logits = logits.to(torch.float32, copy=True)
    if batch.bad_word_bans is not None:
        logits = apply_bans(logits, *batch.bad_word_bans)
    if batch.min_tokens_bans is not None:
        logits = apply_bans(logits, *batch.min_tokens_bans)
    if batch.has_penalties:
        logits = apply_penalties(logits, batch.prompt_token_ids, batch.output_token_ids, batch.repetition_penalty,
                                 batch.presence_penalty, batch.frequency_penalty)
    if batch.logit_bias is not None:
        logits = apply_logit_bias(logits, *batch.logit_bias)
    return logits


def filter_logits(
    logits: torch.Tensor,   # [num_rows, vocab] masked and penalised, modified in place
    batch: SamplingBatch,
) -> torch.Tensor:          # [num_rows, vocab]
    """Temperature, top-k, top-p, min-p."""
    logits = apply_temperature(logits, batch.temperature)
    logits = apply_top_k_top_p(logits, batch.top_k, batch.top_p)
    if batch.min_p is not None:
        logits = apply_min_p(logits, batch.min_p)
    return logits


def process_logits(
    logits: torch.Tensor,   # [num_rows, vocab] raw (not modified)
    batch: SamplingBatch,
) -> torch.Tensor:          # [num_rows, vocab] fp32 after every filter, before the draw
    return filter_logits(mask_and_penalise(logits, batch), batch)


def compute_probs(
    logits: torch.Tensor,   # [num_rows, vocab] raw (not modified)
    batch: SamplingBatch,
    kernels: BitmaskKernels = TORCH_KERNELS,
) -> torch.Tensor:          # [num_rows, vocab] fp32
    """The distribution each row is actually sampled from: greedy rows are one-hot at their argmax."""
    penalised = mask_and_penalise(logits, batch, kernels)
    # (the filters work in place: greedy rows take the argmax of what they leave untouched)
    probs = logits_to_probs(filter_logits(penalised.clone() if batch.any_greedy else penalised, batch))
    if batch.any_greedy:
        one_hot = torch.zeros_like(probs).scatter_(1, penalised.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(batch.greedy[:, None], one_hot, probs)
    return probs


def sample_tokens(
    logits: torch.Tensor,                    # [num_rows, vocab] raw (not modified)
    batch: SamplingBatch,
    draws: DrawKernels = TORCH_DRAWS,
    rule: DrawRule = DrawRule.INVERSE_CDF,
    kernels: BitmaskKernels = TORCH_KERNELS,   # how the grammar bitmask is applied
) -> torch.Tensor:                           # [num_rows] int64
    if batch.all_greedy and batch.argmax_of_raw:   # fast path: greedy rows, at most a grammar mask
        mask = batch.grammar_bitmask
        return logits.argmax(dim=-1) if mask is None else kernels.masked_argmax(logits, mask)
    if batch.grammar_bitmask is not None and batch.grammar_bitmask.is_cpu and batch.bad_word_bans is None \
            and batch.min_tokens_bans is None:   # (on CUDA the check would cost a sync; the draw is cheap there)
        forced = kernels.all_forced(batch.grammar_bitmask, logits.shape[-1])
        if forced is not None:                 # every row's grammar allows one token: every draw returns it
            return torch.tensor(forced, dtype=torch.int64, device=logits.device)
    penalised = mask_and_penalise(logits, batch, kernels)
    if batch.all_greedy:
        return penalised.argmax(dim=-1)
    greedy_ids = penalised.argmax(dim=-1) if batch.any_greedy else None
    probs = logits_to_probs(filter_logits(penalised, batch))
    drawn = draws.draw(probs, batch.keys, rule)
    return drawn if greedy_ids is None else torch.where(batch.greedy, greedy_ids, drawn)


def build_logprobs(
    logits: torch.Tensor,     # [num_rows, vocab] raw
    token_ids: torch.Tensor,  # [num_rows] int64
    num_logprobs: list[int | None],
) -> list[TokenLogprob | None]:
    """``TokenLogprob`` for the rows that asked (chosen token + top-n of log_softmax(raw logits))."""
    rows = [i for i, n in enumerate(num_logprobs) if n is not None]
    result: list[TokenLogprob | None] = [None] * len(num_logprobs)
    if not rows:
        return result
    idx = torch.tensor(rows, device=logits.device)
    num_top = max(num_logprobs[i] for i in rows)
    chosen, top_ids, top_lps = gather_logprobs(logits.index_select(0, idx), token_ids.index_select(0, idx), num_top)
    chosen_l = chosen.tolist()
    ids_l = top_ids.tolist() if top_ids is not None else None
    lps_l = top_lps.tolist() if top_lps is not None else None
    tokens_l = token_ids.index_select(0, idx).tolist()
    for j, i in enumerate(rows):
        k = num_logprobs[i]
        top = list(zip(ids_l[j][:k], lps_l[j][:k])) if ids_l is not None and k else []
        result[i] = TokenLogprob(token_id=tokens_l[j], logprob=chosen_l[j], top=top)
    return result
