"""The model runner: executes one scheduler plan as one forward over every scheduled token.

``execute``: plan (``SchedulerOutput``) → flat tensors (token ids, positions, slot mapping, block
tables, context lengths, which rows to sample) → copy-on-write block copies → one model forward
→ ``ForwardOutput`` (logits of the sampled rows only). ``sample``: those logits (+ an optional
grammar bitmask) → sampler → ``ModelRunnerOutput``. The two are separate calls so that the
engine can fill a bitmask between them (see backend/core/plan.py).
"""
from __future__ import annotations

import numpy as np
import torch

from backend.attention.base import AttentionBackend
from backend.attention.metadata import build_attention_metadata
from backend.core.kv_cache import KVCache
from backend.core.plan import ForwardOutput, ModelRunnerOutput, SchedulerOutput
from backend.lora.residency import LoraSlots
from backend.model.llama import LlamaForCausalLM
from backend.sampling.batch import is_plain_greedy
from backend.sampling.ops import row_argmax
from backend.sampling.rejection import coupled_verify
from backend.sampling.sampler import Sampler


def flat_input_ids(plan: SchedulerOutput) -> np.ndarray:
    """Token ids to compute this step, sequence after sequence. ``[num_tokens]`` int64."""
    chunks = [s.seq.token_ids_between(s.seq.num_computed_tokens, s.seq.num_computed_tokens + s.num_new_tokens)
              for s in plan.scheduled]
    return np.fromiter((t for c in chunks for t in c), dtype=np.int64, count=plan.num_batched_tokens)


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, attn: AttentionBackend, sampler: Sampler,
                 device: torch.device, fast_decode=None, lora: LoraSlots | None = None):
        """``fast_decode``: the step for the decode plans it ``accepts`` (``NativeDecodeStep`` on the CPU,
        ``CudaGraphDecodeStep`` on CUDA), or None (every step eager). ``lora``: the adapters' slots when the
        engine serves LoRA adapters (a plan with adapters runs fast only where the step has ``supports_lora``)."""
        self.model = model
        self.kv_cache = kv_cache
        self.attn = attn
        self.sampler = sampler
        self.device = device
        self.fast_decode = fast_decode
        self.lora = lora

    @torch.inference_mode()
    def execute(self, plan: SchedulerOutput) -> ForwardOutput:
        """Run the forward over every scheduled token; return the logits of the rows to sample."""
        self.sampler.drop(plan.finished_seq_ids)
        if plan.blocks_to_copy:
            self.kv_cache.copy_blocks(plan.blocks_to_copy)
        lora = self.lora.batch(plan) if self.lora is not None else None   # the plan's adapters, or None
        fast = self.fast_decode
        if fast is not None:
            fast.batch.forget_plan(plan)   # every plan, so that rows never outlive their sequences
            if fast.accepts(plan) and (lora is None or fast.supports_lora):
                return fast.run(plan, lora) if lora is not None else fast.run(plan)
        sched = plan.scheduled
        meta = build_attention_metadata(
            [s.seq.num_computed_tokens for s in sched], [s.num_new_tokens for s in sched],
            [s.seq.block_table for s in sched], self.kv_cache.block_size, device=self.device)
        input_ids = torch.from_numpy(flat_input_ids(plan)).to(self.device, non_blocking=True)
        self.attn.prepare(meta)
        hidden = self.model(input_ids, meta.positions, self.attn, lora)  # [num_tokens, hidden]

        # rows to sample: the last new token of every sequence whose chunk reaches its end, and for a
        # speculative verify the k tokens before it too (the last known token and each draft but the last)
        ends = meta.query_start_loc[1:].long() - 1                   # [num_seqs]
        if not any(s.sample for s in sched):
            return ForwardOutput(None, [])
        if not any(s.num_draft_tokens for s in sched):
            rows = [i for i, s in enumerate(sched) if s.sample]
            pick = ends if len(rows) == len(sched) else ends[torch.tensor(rows, device=ends.device)]
        else:
            rows = [i for i, s in enumerate(sched) if s.sample for _ in range(s.num_draft_tokens + 1)]
            back = [s.num_draft_tokens - j for s in sched if s.sample for j in range(s.num_draft_tokens + 1)]
            pick = ends[torch.tensor(rows, device=ends.device)] - torch.tensor(back, device=ends.device)
        return ForwardOutput(self.model.compute_logits(hidden[pick]), rows)  # logits [num_rows, vocab] fp32

    @torch.inference_mode()
    def sample(self, plan: SchedulerOutput, forward: ForwardOutput,
               grammar_bitmask: torch.Tensor | None = None,   # [num_rows, ceil(vocab / 32)] int32, or None
               draft_probs: dict[int, torch.Tensor] | None = None,  # seq_id -> [k, vocab] q of sampled drafts
               ) -> ModelRunnerOutput:
        """Sample the forward's rows (after the grammar mask, when one is given); verify drafts."""
        sched = plan.scheduled
        if grammar_bitmask is not None and self.device.type != "cpu":   # filled on the host
            grammar_bitmask = grammar_bitmask.to(self.device, non_blocking=True)
        sampled: list[list[int]] = [[] for _ in sched]
        logprobs: list = [None] * len(sched)
        if forward.logits is None:
            return ModelRunnerOutput(sampled, logprobs)
        order = list(dict.fromkeys(forward.rows))                    # plan indices that sample, in row order
        if len(order) == len(forward.rows):                          # no drafts: one row per sequence
            seqs = [sched[i].seq for i in order]
            if all(is_plain_greedy(s) for s in seqs):   # (masked) argmax, no batch to build
                for i, t in zip(order, self._argmax(forward.logits, grammar_bitmask)):
                    sampled[i] = [t]
                return ModelRunnerOutput(sampled, logprobs)
            result = self.sampler.sample(forward.logits,
                                         self.sampler.build_batch(seqs, grammar_bitmask=grammar_bitmask))
            token_ids = result.token_ids.tolist()
            for j, i in enumerate(order):
                sampled[i] = [token_ids[j]]
                if result.logprobs is not None and result.logprobs[j] is not None:
                    logprobs[i] = [result.logprobs[j]]
            return ModelRunnerOutput(sampled, logprobs)
        seqs = [sched[i].seq for i in order]
        drafts = [sched[i].seq.draft_token_ids[:sched[i].num_draft_tokens] for i in order]
        if all(is_plain_greedy(s) for s in seqs):   # no batch, no probabilities
            for i, tokens in zip(order, coupled_verify(self._argmax(forward.logits, grammar_bitmask), drafts)):
                sampled[i] = tokens
            return ModelRunnerOutput(sampled, logprobs)
        qs = [draft_probs.get(s.seq_id) for s in seqs] if draft_probs else None
        result = self.sampler.verify(forward.logits, seqs, drafts, qs, grammar_bitmask)
        for j, i in enumerate(order):
            sampled[i] = result.token_ids[j]
            logprobs[i] = result.logprobs[j]
        return ModelRunnerOutput(sampled, logprobs)

    def _argmax(self, logits: torch.Tensor,                 # [num_rows, vocab]
                bitmask: torch.Tensor | None) -> list[int]:  # [num_rows, ceil(vocab / 32)] int32, or None
        """Each row's argmax; among the tokens its grammar allows when there is a bitmask."""
        if bitmask is None:
            return row_argmax(logits)
        return self.sampler.bitmask_kernels.masked_argmax(logits, bitmask).tolist()
