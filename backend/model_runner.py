"""The model runner: executes one scheduler plan as one forward over every scheduled token.

plan (``SchedulerOutput``) → flat tensors (token ids, positions, slot mapping, block
tables, context lengths, which rows to sample) → copy-on-write block copies → one
model forward → logits of the sampled rows only → sampler → ``ModelRunnerOutput``.
"""
from __future__ import annotations

import numpy as np
import torch

from .attention.base import AttentionBackend
from .attention.metadata import build_attention_metadata
from .kv_cache import KVCache
from .llama import LlamaForCausalLM
from .runner_output import ModelRunnerOutput
from .sampler import Sampler
from .scheduler import SchedulerOutput


def flat_input_ids(plan: SchedulerOutput) -> np.ndarray:
    """Token ids to compute this step, sequence after sequence. ``[num_tokens]`` int64."""
    chunks = []
    for s in plan.scheduled:
        seq, start = s.seq, s.seq.num_computed_tokens
        n_known = seq.num_tokens
        end = start + s.num_new_tokens
        if end <= n_known:
            if start >= seq.num_prompt_tokens:
                chunks.append(seq.output_token_ids[start - seq.num_prompt_tokens:end - seq.num_prompt_tokens])
            elif end <= seq.num_prompt_tokens:
                chunks.append(seq.prompt_token_ids[start:end])
            else:
                chunks.append(seq.all_token_ids[start:end])
        else:  # the tail runs past the known tokens into the draft tokens (speculative verify)
            chunks.append((seq.all_token_ids + seq.draft_token_ids)[start:end])
    return np.fromiter((t for c in chunks for t in c), dtype=np.int64, count=plan.num_batched_tokens)


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, attn: AttentionBackend, sampler: Sampler,
                 device: torch.device):
        self.model = model
        self.kv_cache = kv_cache
        self.attn = attn
        self.sampler = sampler
        self.device = device

    @torch.inference_mode()
    def execute(self, plan: SchedulerOutput) -> ModelRunnerOutput:
        if plan.blocks_to_copy:
            self.kv_cache.copy_blocks(plan.blocks_to_copy)
        sched = plan.scheduled
        meta = build_attention_metadata(
            [s.seq.num_computed_tokens for s in sched], [s.num_new_tokens for s in sched],
            [s.seq.block_table for s in sched], self.kv_cache.block_size, device=self.device)
        input_ids = torch.from_numpy(flat_input_ids(plan)).to(self.device, non_blocking=True)
        self.attn.prepare(meta)
        hidden = self.model(input_ids, meta.positions, self.attn)  # [num_tokens, hidden]

        # rows to sample: the last new token of every sequence whose chunk reaches its end
        ends = meta.query_start_loc[1:].long() - 1                   # [num_seqs]
        rows = [i for i, s in enumerate(sched) if s.sample]
        if not rows:
            return ModelRunnerOutput([[] for _ in sched], [None] * len(sched))
        if len(rows) == len(sched):
            sample_hidden = hidden[ends]
        else:
            sample_hidden = hidden[ends[torch.tensor(rows, device=ends.device)]]
        logits = self.model.compute_logits(sample_hidden)            # [num_sampled, vocab] fp32
        seqs = [sched[i].seq for i in rows]
        result = self.sampler.sample(logits, seqs)
        token_ids = result.token_ids.tolist()
        sampled: list[list[int]] = [[] for _ in sched]
        logprobs: list = [None] * len(sched)
        for j, i in enumerate(rows):
            sampled[i] = [token_ids[j]]
            if result.logprobs is not None and result.logprobs[j] is not None:
                logprobs[i] = [result.logprobs[j]]
        return ModelRunnerOutput(sampled, logprobs)
