"""A request's output side: stop rules, and streaming its sequences' tokens in ``RequestOutput``s.

Streaming (``stream_interval = k``): a sequence's first token goes out at once (time to first
token), later ones every ``k`` tokens, and whatever is buffered goes out with the sequence's
final output. Each request gets exactly one output with ``request_finished=True``: the final
output of the last of its ``n`` sequences to finish.
"""
from __future__ import annotations

import time
from collections.abc import Collection
from collections.abc import Sequence as Seq
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from backend.core.outputs import FinishReason, RequestOutput, RequestStats, TokenLogprob
from backend.core.sequence import Sequence


def stop_reason(seq: Sequence, token: int, eos_token_ids: Collection[int], max_model_len: int) -> FinishReason | None:
    """Why the sequence ends after appending ``token`` (already in ``output_token_ids``), if it does.

    EOS (unless ``ignore_eos``) and ``stop_token_ids`` stop only once ``min_tokens`` are out
    (the sampler also masks them before that); ``max_tokens`` or a full context end it with LENGTH.
    """
    p = seq.params
    if seq.num_output_tokens >= p.min_tokens:
        if (not p.ignore_eos and token in eos_token_ids) or token in p.stop_token_ids:
            return FinishReason.STOP
    if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= max_model_len:
        return FinishReason.LENGTH
    return None


def run_continues(seq: Sequence, tokens: list[int], eos_token_ids: AbstractSet[int], max_model_len: int) -> bool:
    """True only where ``stop_reason`` is None after each of ``tokens`` (not yet appended): none of them is an EOS or
    a stop token id, and ``max_tokens`` and the context leave room for them all. A verify step's accepted run is then
    appended at once; False (a stop token that ``min_tokens`` may still hold back, among others) sends the caller
    token by token through ``stop_reason``."""
    p, m = seq.params, len(tokens)
    if len(seq.output_token_ids) + m >= p.max_tokens or seq.num_tokens + m >= max_model_len:
        return False
    if not p.ignore_eos and not eos_token_ids.isdisjoint(tokens):
        return False
    return not p.stop_token_ids or all(t not in p.stop_token_ids for t in tokens)


@dataclass(eq=False)
class RequestState:
    request_id: str
    seqs: list[Sequence]                          # index order, n of them
    pending_forks: list[Sequence]                 # seqs 1..n-1 until seq 0's prefill completes
    num_emitted: list[int] = field(default_factory=list)                  # per seq: output tokens streamed
    logprob_buf: list[list[TokenLogprob]] = field(default_factory=list)   # per seq: not yet streamed
    num_finished: int = 0

    def __post_init__(self) -> None:
        self.num_emitted = [0] * len(self.seqs)
        self.logprob_buf = [[] for _ in self.seqs]

    @property
    def finished(self) -> bool:
        return self.num_finished == len(self.seqs)

    def count_finished(self) -> None:
        """One more of the request's sequences finished (the scheduler finished it)."""
        self.num_finished += 1

    def emit(self, seq: Sequence, stream_interval: int, error: str | None = None) -> RequestOutput | None:
        """The sequence's next streamed output, or None while buffering."""
        i = seq.seq_index
        start = self.num_emitted[i]
        n_new = seq.num_output_tokens - start
        if not seq.is_finished and (n_new == 0 or (start > 0 and n_new < stream_interval)):
            return None
        self.num_emitted[i] = seq.num_output_tokens
        if seq.is_finished and seq.timeline.finished is None:
            seq.timeline.finished = time.monotonic()
        request_finished = seq.is_finished and self.finished
        want_lp = seq.params.logprobs is not None
        lps, self.logprob_buf[i] = self.logprob_buf[i], []
        return RequestOutput(
            request_id=self.request_id, seq_index=i, new_token_ids=seq.output_token_ids[start:],
            finished=seq.is_finished, request_finished=request_finished,
            finish_reason=seq.finish_reason, error=error, logprobs=lps if want_lp else None,
            cum_logprob=seq.cum_logprob if want_lp else None, num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens, num_draft_tokens=seq.num_spec_draft_tokens,
            num_accepted_draft_tokens=seq.num_spec_accepted_tokens,
            stats=request_stats(self.seqs) if request_finished else None)


def request_stats(seqs: Seq[Sequence]) -> RequestStats:
    """A finished request's stats from its sequences' timelines (index order, ``seqs[0]`` first)."""
    first = seqs[0]
    now = time.monotonic()

    def earliest(values):
        values = [v for v in values if v is not None]
        return min(values) if values else None

    itl: list[float] = []
    chunks: list[tuple[float, float, int]] = []
    preemptions: list[float] = []
    decode_times = []
    for s in seqs:
        tl = s.timeline
        itl.extend(tl.inter_token_latencies[:max(0, s.num_output_tokens - 1)])
        chunks.extend(tl.prefill_chunks)
        preemptions.extend(tl.preemptions)
        if s.first_token_time is not None:
            end = tl.last_token if tl.last_token is not None else (tl.finished or now)
            decode_times.append((max(0.0, end - s.first_token_time), s.num_output_tokens))
    return RequestStats(
        arrival_time=first.arrival_time,
        first_scheduled_time=earliest(s.timeline.first_scheduled for s in seqs),
        first_token_time=earliest(s.first_token_time for s in seqs),
        finished_time=max((s.timeline.finished or now) for s in seqs),
        num_prompt_tokens=first.num_prompt_tokens,
        num_cached_tokens=first.num_cached_tokens,
        num_output_tokens=sum(s.num_output_tokens for s in seqs),
        num_decode_steps=sum(s.timeline.num_decode_steps for s in seqs),
        num_prefill_chunks=sum(s.timeline.num_prefill_chunks for s in seqs),
        num_preemptions=sum(s.num_preemptions for s in seqs),
        seed=first.params.seed,
        prefill_chunks=tuple(sorted(chunks)),
        preemption_times=tuple(sorted(preemptions)),
        inter_token_latencies=tuple(itl),
        decode_times=tuple(decode_times),
        last_step_time=max((s.timeline.last_step for s in seqs if s.timeline.last_step is not None), default=None),
    )
