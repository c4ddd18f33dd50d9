"""The batched sampler: one call per step over every row to sample (``sample``), or over every verified row of a
speculative step (``verify``), through the pipeline of ``processing.py``. It gives each row its key (the request's
seed, the sequence's index, the output position: ``keyed_draw.py``) and holds the configuration's draw rule.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence as Seq

import torch

from backend.core.outputs import TokenLogprob
from backend.core.sequence import Sequence
from backend.sampling.batch import GREEDY_EPS, SamplingBatch, build_sampling_batch, reads_output_ids
from backend.sampling.bitmask_kernels import TORCH_KERNELS, BitmaskKernels
from backend.sampling.keyed_draw import TORCH_DRAWS, DrawKernels, DrawKeys, DrawRule
from backend.sampling.keyed_noise import NoiseStream
from backend.sampling.processing import build_logprobs, compute_probs, sample_tokens
from backend.sampling.rejection import (
    acceptance_probs,
    coupled_verify,
    host_rejection_rule,
    num_accepted,
    recovery_probs,
)


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor                 # [num_rows] int64
    logprobs: list[TokenLogprob | None] | None = None  # per row when any row asked; None otherwise


@dataclass
class VerifyOutput:
    """Per sequence: its new tokens (accepted drafts, then the recovered or bonus token) and their logprobs."""

    token_ids: list[list[int]]
    logprobs: list[list[TokenLogprob] | None]
    num_accepted: list[int]


class Sampler:
    """Owns the vocabulary facts and the draw: its rule (one per engine configuration) and kernels. A row's key
    is its request's seed, its sequence index and its output position (``keyed_draw.py``); a sequence whose
    request has no seed (the engine gives every sampled request one; direct callers may not) takes a seed
    drawn from ``seed`` on first use, kept until ``drop``."""

    def __init__(self, vocab_size: int, device: torch.device | str = "cpu", seed: int | None = None,
                 eos_token_ids: Seq[int] = (), bitmask_kernels: BitmaskKernels = TORCH_KERNELS,
                 draws: DrawKernels = TORCH_DRAWS, rule: DrawRule = DrawRule.INVERSE_CDF):
        self.vocab_size = vocab_size
        self.bitmask_kernels = bitmask_kernels   # the grammar mask: native on the CPU with the native step
        self.draws = draws                       # the keyed draws: native on the CPU when built
        self.rule = rule
        self.device = torch.device(device)
        self.eos_token_ids = tuple(eos_token_ids)
        self._seed_source = random.Random(seed)
        self._drawn_seeds: dict[int, int] = {}   # seq_id -> the seed drawn for a sequence without one

    def seed_for(self, seq: Sequence) -> int:
        """The seed the sequence's draws are keyed by."""
        if seq.params.seed is not None:
            return seq.params.seed
        if seq.params.temperature < GREEDY_EPS:
            return 0                             # greedy rows draw nothing
        seed = self._drawn_seeds.get(seq.seq_id)
        if seed is None:
            seed = self._drawn_seeds[seq.seq_id] = self._seed_source.getrandbits(64)
        return seed

    def keys(self, seqs: Seq[Sequence], offsets: Seq[int] | None = None) -> DrawKeys:
        """Each sequence's key at its next output position, ``offsets[i]`` positions on."""
        positions = [len(s.output_token_ids) for s in seqs]
        if offsets is not None:
            positions = [p + o for p, o in zip(positions, offsets)]
        return DrawKeys([self.seed_for(s) for s in seqs], [s.seq_index for s in seqs], positions)

    def drop(self, seq_ids: Seq[int]) -> None:
        """Forget the drawn seeds of sequences that ended."""
        for seq_id in seq_ids:
            self._drawn_seeds.pop(seq_id, None)

    @property
    def num_drawn_seeds(self) -> int:
        return len(self._drawn_seeds)

    def build_batch(self, seqs: Seq[Sequence], output_token_ids: Seq[list[int]] | None = None,
                    grammar_bitmask: torch.Tensor | None = None, offsets: Seq[int] | None = None) -> SamplingBatch:
        """One row per sequence; ``offsets``: each row's position past its sequence's output (a verify step's rows,
        a draft's proposals)."""
        return build_sampling_batch(seqs, self.vocab_size, eos_token_ids=self.eos_token_ids, device=self.device,
                                    output_token_ids=output_token_ids, grammar_bitmask=grammar_bitmask,
                                    keys=self.keys(seqs, offsets))

    def sample(
        self,
        logits: torch.Tensor,  # [num_rows, vocab] fp32
        batch: SamplingBatch | Seq[Sequence],
    ) -> SamplerOutput:
        """Sample one token per row; ``batch`` may be the step's sequences (one row each)."""
        if not isinstance(batch, SamplingBatch):
            batch = self.build_batch(batch)
        if logits.shape != (batch.num_rows, batch.vocab_size):
            raise ValueError(f"logits {tuple(logits.shape)} do not match the batch "
                             f"({batch.num_rows} rows, vocab {batch.vocab_size})")
        token_ids = sample_tokens(logits, batch, self.draws, self.rule, self.bitmask_kernels)
        logprobs = build_logprobs(logits, token_ids, batch.num_logprobs) \
            if batch.max_num_logprobs is not None else None
        return SamplerOutput(token_ids, logprobs)

    def verify(
        self,
        logits: torch.Tensor,                          # [sum(1 + k_i), vocab] fp32: rows of seq i, then seq i+1...
        seqs: Seq[Sequence],                           # B sequences
        drafts: Seq[list[int]],                        # per sequence, its k_i drafts (may be empty)
        draft_probs: Seq[torch.Tensor | None] | None = None,   # per sequence [k_i, vocab] q, None: coupled drafts
        grammar_bitmask: torch.Tensor | None = None,   # [sum(1 + k_i), ceil(vocab / 32)] int32
    ) -> VerifyOutput:
        """Speculative verification over every sequence's drafts at once.

        Row ``j`` of sequence ``i`` is the target at the position after its ``j``-th draft, with the sampling
        filters of plain sampling at that position (penalties and bans see the drafts before it as output). Drafts
        without ``q`` (n-gram drafts; a draft model's drafts drawn with the target's keyed noise) are *coupled*:
        each row draws its keyed token, a draft is accepted iff it equals the draw at its row, and the first draw
        that differs (or the bonus row's) is emitted, so the tokens are exactly those of plain steps. Drafts with
        ``q`` take standard rejection sampling (``rejection.py``), with keyed uniforms.
        """
        counts = [len(d) for d in drafts]
        rows_seqs = [s for s, k in zip(seqs, counts) for _ in range(k + 1)]
        offsets = [j for k in counts for j in range(k + 1)]
        outputs = [s.output_token_ids + d[:j] for s, d, k in zip(seqs, drafts, counts) for j in range(k + 1)] \
            if any(map(reads_output_ids, seqs)) else None       # (else no filter reads them)
        batch = self.build_batch(rows_seqs, output_token_ids=outputs, grammar_bitmask=grammar_bitmask,
                                 offsets=offsets)
        probs = compute_probs(logits, batch, self.bitmask_kernels)             # [R, vocab]; greedy rows one-hot
        qs = None if draft_probs is None or all(q is None for q in draft_probs) else list(draft_probs)
        if qs is None:
            token_ids = coupled_verify(self.draws.draw(probs, batch.keys, self.rule).tolist(), list(drafts))
            acc = [len(t) - 1 for t in token_ids]
        else:
            acc, fin = self._standard_rejection(probs, seqs, drafts, counts, qs)
            token_ids = [d[:a] + [f] for d, a, f in zip(drafts, acc, fin)]
        logprobs: list[list[TokenLogprob] | None] = [None] * len(seqs)
        if any(s.params.logprobs is not None for s in seqs):
            starts = _row_starts(counts)
            rows = [starts[i] + j for i, t in enumerate(token_ids) for j in range(len(t))]
            flat = [t for ts in token_ids for t in ts]
            nlp = [seqs[i].params.logprobs for i, t in enumerate(token_ids) for _ in t]
            dev = logits.device
            lps = build_logprobs(logits[torch.tensor(rows, device=dev)], torch.tensor(flat, device=dev), nlp)
            pos = 0
            for i, t in enumerate(token_ids):
                if seqs[i].params.logprobs is not None:
                    logprobs[i] = lps[pos:pos + len(t)]
                pos += len(t)
        return VerifyOutput(token_ids, logprobs, acc)

    def _standard_rejection(
        self,
        probs: torch.Tensor,                   # [R, vocab] p of every row
        seqs: Seq[Sequence],
        drafts: Seq[list[int]],
        counts: list[int],
        qs: list[torch.Tensor | None],         # per sequence [k_i, vocab] q, None: a point mass
    ) -> tuple[list[int], list[int]]:          # (accepted drafts per sequence, the recovered or bonus token)
        """Leviathan et al.'s rule: draft ``j`` is accepted when the keyed uniform of its position (stream
        ``ACCEPT``) is below ``min(1, p/q)``; the last token is drawn from the residual or ``p_k`` (``RESIDUAL``)."""
        b, k_max = len(seqs), max(counts)
        u = torch.empty(b, 0, dtype=torch.float32)
        if k_max:
            keys = self.keys([s for s in seqs for _ in range(k_max)], [j for _ in seqs for j in range(k_max)])
            u = self.draws.uniforms(keys, NoiseStream.ACCEPT, probs.device).view(b, k_max).to(torch.float32)
        if self.host_rule(probs) and all(q is None or self.host_rule(q) for q in qs):
            acc, last_np = host_rejection_rule(probs.numpy(), _row_starts(counts), list(drafts), u.numpy(),
                                               [q if q is None else q.numpy() for q in qs])
            last = torch.from_numpy(last_np)                                   # [B, vocab]
        else:
            acc, last = self._rejection_rule(probs, drafts, counts, qs, u)
        fin = self.draws.draw(last.contiguous(), self.keys(seqs, acc), DrawRule.INVERSE_CDF, NoiseStream.RESIDUAL)
        return acc, fin.tolist()

    @staticmethod
    def host_rule(t: torch.Tensor) -> bool:
        """Whether the rejection rule runs on the host for this tensor (``host_rejection_rule``): contiguous float32 on
        the CPU. On other devices the batched tensor ops are asynchronous and cheap."""
        return t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()

    @staticmethod
    def _rejection_rule(
        probs: torch.Tensor,                           # [R, vocab] p of every row
        drafts: Seq[list[int]],
        counts: list[int],
        draft_probs: Seq[torch.Tensor | None] | None,  # per sequence [k_i, vocab] q, None: point masses
        u: torch.Tensor | None,                        # [B, max k] acceptance uniforms; None when no drafts
    ) -> tuple[list[int], torch.Tensor]:               # (accepted per sequence, [B, vocab] the last token's dist.)
        """The rejection rule batched in tensor ops (any device, any draft distributions)."""
        b, k_max, dev = len(drafts), max(counts), probs.device
        first = torch.tensor(_row_starts(counts), dtype=torch.int64, device=dev)      # [B] first row of each seq
        offs = torch.arange(k_max + 1, device=dev)
        n_drafts = torch.tensor(counts, dtype=torch.int64, device=dev)
        # [B, K+1] row of each (sequence, position); padding positions repeat the sequence's first row
        idx = torch.where(offs[None, :] <= n_drafts[:, None], first[:, None] + offs[None, :], first[:, None])
        target = probs[idx]                                                    # [B, K+1, vocab]
        draft_ids = torch.tensor([d + [0] * (k_max - len(d)) for d in drafts], dtype=torch.int64, device=dev)
        q = _padded_draft_probs(draft_probs, draft_ids, counts, probs.shape[1]) if k_max else None
        if k_max:
            accepted = num_accepted(acceptance_probs(draft_ids, target, q), u, n_drafts)
        else:
            accepted = torch.zeros(b, dtype=torch.int64, device=dev)
        return accepted.tolist(), recovery_probs(accepted, n_drafts, draft_ids, target, q)


def _row_starts(counts: Seq[int]) -> list[int]:
    starts, pos = [], 0
    for k in counts:
        starts.append(pos)
        pos += k + 1
    return starts


def _padded_draft_probs(
    draft_probs: Seq[torch.Tensor | None] | None,
    draft_ids: torch.Tensor,   # [B, K] int64
    counts: Seq[int],
    vocab: int,
) -> torch.Tensor | None:      # [B, K, vocab] fp32, point masses where a sequence has no q; None: all point masses
    if draft_probs is None or all(q is None for q in draft_probs):
        return None
    q = torch.zeros(*draft_ids.shape, vocab, dtype=torch.float32, device=draft_ids.device)
    q.scatter_(2, draft_ids[:, :, None], 1.0)
    for i, (dp, k) in enumerate(zip(draft_probs, counts)):
        if dp is not None and k:
            q[i, :k] = dp[:k]
    return q
