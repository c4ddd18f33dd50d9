"""Draft-model proposer: a small model sharing the target's tokenizer proposes ``k`` tokens per step.

It has its own paged KV cache and block manager (prefix caching on, keyed by the draft checkpoint),
one shadow ``Sequence`` per target sequence sharing the target's prompt and output lists (so its
known tokens are exactly the verified ones, and the prefix cache never publishes a block holding
an unverified draft). Each call runs, for all proposing sequences at once:
1. roll back: draft K/V beyond the verified tokens the draft got right is dropped (``truncate``);
2. catch up: one forward over each sequence's known tokens not yet in the draft cache (usually the
   recovered/bonus token, and the last accepted draft; the whole prompt for a new sequence, minus
   prefix-cache hits), sampling draft 1 from its last position;
3. ``k - 1`` one-token forwards, each feeding the previous draft.
No scheduler round trip and no per-token allocation: blocks for all ``k`` positions are taken up
front. The forwards run through the native decode op when the fast decode step is on and the op
serves the draft (``draft_forward.py``), else eagerly. Drafts of sampled requests are drawn from ``q`` (the
draft's logits under the request's own sampling filters); greedy requests take the draft's argmax. With
``draft_coupling`` gumbel a draft is the exponential race over ``q`` with the target's keyed noise at its
position (``DrawRule.GUMBEL``), so the verifier accepts it iff the target's draw there equals it and needs no
``q``; with rejection it is an inverse-CDF draw of the draft's own noise (``NoiseStream.DRAFT``) and ``q`` goes
to standard rejection sampling.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from backend.attention.window import serving_windows
from backend.config import EngineConfig
from backend.core.block_manager import BlockManager
from backend.core.kv_cache import KVCache
from backend.core.sequence import Sequence
from backend.model.config import CheckpointError, ModelConfig
from backend.model.fused import fused_ops
from backend.model.llama import LlamaForCausalLM
from backend.model.loader import load_model
from backend.sampling.batch import GREEDY_EPS, SamplingBatch, is_plain_greedy
from backend.sampling.keyed_draw import DrawKernels, DrawRule
from backend.sampling.keyed_noise import NoiseStream
from backend.sampling.ops import row_argmax
from backend.sampling.processing import compute_probs
from backend.sampling.sampler import Sampler
from backend.spec_decode.draft_forward import DraftForward
from backend.spec_decode.proposer import DraftGrammar, DraftMasks, Proposal, Proposer

CATCH_UP_AHEAD = 8   # known tokens missing from a draft cache above which ``catch_up`` feeds them untimed


@dataclass
class _DraftState:
    shadow: Sequence                       # shares prompt/output lists with the target sequence
    fed_base: int = 0                      # known tokens when drafts were last fed
    fed: list[int] = field(default_factory=list)   # drafts whose K/V the draft cache holds past fed_base


class _Run:
    """One proposal in progress: its sequences, their drafts so far and the ``q`` each was drawn from."""

    def __init__(self, active: list[tuple[_DraftState, int]], masks: DraftMasks | None):
        self.active = active
        self.masks = masks
        self.drafts: list[list[int]] = [[] for _ in active]
        self.probs: list[list[torch.Tensor]] = [[] for _ in active]   # per sequence: [vocab] q per draft
        # drafts are the argmax of the raw logits (drafting only lengthens the output: min_tokens stays met)
        self.plain = [is_plain_greedy(st.shadow) for st, _ in active]
        self.static = [filters_ignore_output(st.shadow) for st, _ in active]
        self.batches: dict[tuple[int, ...], SamplingBatch] = {}      # rows -> their batch, when static


def filters_ignore_output(seq: Sequence) -> bool:
    """The sequence's sampling filters stay the same however long its output grows: no penalties, no bad
    words, ``min_tokens`` already met (temperature, top-k, top-p, min-p and the RNG do not look at it)."""
    p = seq.params
    return (p.repetition_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
            and not p.bad_words_ids and len(seq.output_token_ids) >= p.min_tokens)


def tokenizer_identity(folder: Path) -> str | None:
    path = folder / "tokenizer.json"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def check_draft_compatible(draft: ModelConfig, draft_folder: Path, target: ModelConfig, target_folder: Path,
                           max_model_len: int) -> None:
    """The draft must speak the target's tokens: same vocabulary size and tokenizer, and reach the context."""
    if draft.vocab_size != target.vocab_size:
        raise CheckpointError(f"draft_model_path: {draft_folder} has vocab_size {draft.vocab_size}, the target "
                              f"{target.vocab_size}; the draft must share the target's tokenizer")
    ours, theirs = tokenizer_identity(draft_folder), tokenizer_identity(target_folder)
    if ours is None:
        raise CheckpointError(f"draft_model_path: {draft_folder / 'tokenizer.json'} is missing; the draft must "
                              "ship the target's tokenizer")
    if ours != theirs:
        raise CheckpointError(f"draft_model_path: {draft_folder / 'tokenizer.json'} differs from the target's "
                              "tokenizer; the draft must share the target's tokenizer")
    if draft.max_position_embeddings < max_model_len:
        raise CheckpointError(f"draft_model_path: the draft's max_position_embeddings "
                              f"({draft.max_position_embeddings}) is below max_model_len ({max_model_len})")


class DraftModelProposer(Proposer):
    method = "draft"

    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, block_manager: BlockManager, sampler: Sampler,
                 windows=None, forward: DraftForward | None = None):
        self.model = model
        self.kv_cache = kv_cache
        self.bm = block_manager
        self.forward = forward if forward is not None else DraftForward(model, kv_cache, windows)
        self.sampler = sampler
        self._states: dict[int, _DraftState] = {}

    @classmethod
    def load(cls, folder: Path, target_folder: Path, target: ModelConfig, config: EngineConfig, *, num_blocks: int,
             device: torch.device, dtype: torch.dtype, max_model_len: int,
             native_step=None) -> DraftModelProposer:
        """The draft checkpoint at ``folder`` beside the target's; ``native_step`` builds its fast decode step
        (``DraftForward.build``; None: eager)."""
        if not (folder / "config.json").is_file():
            raise CheckpointError(f"draft_model_path: {folder} has no config.json")
        dcfg = ModelConfig.from_file(folder / "config.json")
        check_draft_compatible(dcfg, folder, target, target_folder, max_model_len)
        model = load_model(folder, dtype=dtype, device=device, max_positions=max_model_len)
        model.fused = fused_ops(device, dtype, dcfg.head_dim)[0]      # as the target's (backend/model/fused.py)
        kv = KVCache(dcfg.num_hidden_layers, num_blocks, config.cache.block_size, dcfg.num_key_value_heads,
                     dcfg.head_dim,
                     dtype=dtype, device=device)
        key = hashlib.sha256(json.dumps(dcfg.__dict__, default=str, sort_keys=True).encode()
                             + (tokenizer_identity(folder) or "").encode()).hexdigest()[:32]
        bm = BlockManager(num_blocks, config.cache.block_size, enable_prefix_caching=config.cache.enable_prefix_caching,
                          cache_key="draft:" + key)
        sampler = Sampler(dcfg.vocab_size, device=device, seed=config.model.seed, draws=DrawKernels.for_device(device),
                          rule=DrawRule.of(config.speculative.speculative_method, config.speculative.draft_coupling))
        windows = serving_windows(dcfg.sliding_windows, dcfg.num_hidden_layers, max_model_len)
        forward = DraftForward.build(model, kv, windows, native_step)
        return cls(model, kv, bm, sampler, windows, forward)

    # ---- per-sequence state --------------------------------------------------------------------
    def _state(self, seq: Sequence) -> _DraftState:
        st = self._states.get(seq.seq_id)
        if st is None:
            shadow = Sequence(seq_id=seq.seq_id, request_id=seq.request_id, seq_index=seq.seq_index,
                              prompt_token_ids=seq.prompt_token_ids, params=seq.params,
                              output_token_ids=seq.output_token_ids)
            st = self._states[seq.seq_id] = _DraftState(shadow)
        return st

    def _roll_back(self, st: _DraftState) -> None:
        """Keep the draft K/V only for verified tokens: the known prefix, plus fed drafts that were accepted."""
        shadow = st.shadow
        if shadow.num_computed_tokens <= st.fed_base:
            return
        p = shadow.num_prompt_tokens
        verified = shadow.output_token_ids[st.fed_base - p:]
        good = 0
        while good < len(st.fed) and good < len(verified) and st.fed[good] == verified[good]:
            good += 1
        # always re-feed the last known token: its logits propose the first draft (its K/V may be there already,
        # when the scheduler verified fewer drafts than were fed and the last one equals the bonus token)
        keep = min(shadow.num_computed_tokens, st.fed_base + good, shadow.num_tokens - 1)
        if keep < shadow.num_computed_tokens:
            self.bm.truncate(shadow, keep)
            shadow.num_computed_tokens = keep
        st.fed = []

    def _reserve(self, st: _DraftState, k: int) -> bool:
        """Blocks for the catch-up tokens and the ``k - 1`` drafts fed after them; False when short."""
        shadow = st.shadow
        if not shadow.block_table:
            computed = self.bm.get_computed_blocks(shadow)
            n = shadow.num_tokens - computed.num_cached_tokens + k - 1
            if self.bm.allocate_slots(shadow, n, computed=computed) is None:
                return False
            shadow.num_computed_tokens = computed.num_cached_tokens
            return True
        return self.bm.allocate_slots(shadow, shadow.num_tokens - shadow.num_computed_tokens + k - 1) is not None

    # ---- proposing ------------------------------------------------------------------------------
    @torch.inference_mode()
    def catch_up(self, seqs: list[Sequence], num_drafts: list[int]) -> None:
        """Bring the draft cache of each sequence more than ``CATCH_UP_AHEAD`` tokens behind (a new sequence's
        prompt less prefix-cache hits, or the tokens since it last drafted) up to all but its last known token, in
        one forward: a one-off per request, outside the proposal that the adaptive policy times per step."""
        behind = []
        for seq, k in zip(seqs, num_drafts):
            if k <= 0:
                continue
            st = self._state(seq)
            self._roll_back(st)
            if st.shadow.num_tokens - 1 - st.shadow.num_computed_tokens > CATCH_UP_AHEAD and self._reserve(st, k):
                behind.append(st)        # (a new sequence's reservation counts its prefix-cache hits as computed)
        behind = [st for st in behind if st.shadow.num_tokens - 1 > st.shadow.num_computed_tokens]
        if not behind:
            return
        starts = [st.shadow.num_computed_tokens for st in behind]
        news = [st.shadow.num_tokens - 1 - s for st, s in zip(behind, starts)]
        ids = [t for st, s, n in zip(behind, starts, news) for t in st.shadow.all_token_ids[s:s + n]]
        self.forward.begin([st.shadow.block_table for st in behind])
        self.forward.logits(list(range(len(behind))), starts, news, ids)     # K/V only: the logits are not needed
        for st, n in zip(behind, news):
            st.shadow.num_computed_tokens += n
            st.fed_base = st.shadow.num_computed_tokens
            self.bm.commit_full_blocks(st.shadow)

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], num_drafts: list[int], grammar: DraftGrammar | None = None) -> Proposal:
        active: list[tuple[_DraftState, int]] = []
        for seq, k in zip(seqs, num_drafts):
            if k <= 0:
                continue
            st = self._state(seq)
            self._roll_back(st)
            if self._reserve(st, k):
                active.append((st, k))
        out = Proposal()
        if not active:
            return out
        masks = grammar.draft_session([st.shadow for st, _ in active]) if grammar is not None else None
        self.forward.begin([st.shadow.block_table for st, _ in active])
        try:
            self._draft(active, out, masks)
        finally:
            if masks is not None:
                masks.close()
        return out

    def _draft(self, active: list[tuple[_DraftState, int]], out: Proposal, masks: DraftMasks | None) -> None:
        run = _Run(active, masks)
        # step 1: catch up on the known tokens; the last position proposes draft 1
        starts = [st.shadow.num_computed_tokens for st, _ in active]
        news = [st.shadow.num_tokens - s for (st, _), s in zip(active, starts)]
        ids = [t for (st, _), s in zip(active, starts) for t in st.shadow.all_token_ids[s:]]
        self._forward_and_draw(run, list(range(len(active))), starts, news, ids)
        for (st, _), n in zip(active, news):
            st.fed_base = st.shadow.num_tokens
            st.shadow.num_computed_tokens += n
        # steps 2..k: feed the previous draft
        drafts = run.drafts
        for step in range(1, max(k for _, k in active)):
            rows = [i for i, (_, k) in enumerate(active) if k > step]
            starts = [active[i][0].shadow.num_computed_tokens for i in rows]
            self._forward_and_draw(run, rows, starts, [1] * len(rows), [drafts[i][-1] for i in rows])
            for i in rows:
                st = active[i][0]
                st.fed.append(drafts[i][-2])
                st.shadow.num_computed_tokens += 1
        for i, (st, _) in enumerate(active):
            self.bm.commit_full_blocks(st.shadow)
            out.draft_token_ids[st.shadow.seq_id] = drafts[i]
            if self.sampler.rule is not DrawRule.GUMBEL and st.shadow.params.temperature >= GREEDY_EPS:
                out.draft_probs[st.shadow.seq_id] = torch.stack(run.probs[i])

    def _forward_and_draw(self, run: _Run, rows: list[int], starts: list[int], news: list[int], ids: list[int]
                          ) -> None:
        """One forward over ``news[j]`` tokens of each ``run.active[rows[j]]``; draw one draft for each (a guided
        sequence's from the draft's distribution under its grammar mask, as the target samples)."""
        logits = self.forward.logits(rows, starts, news, ids)                     # [len(rows), vocab]
        drafts, masks = run.drafts, run.masks
        bitmask = masks.bitmask(rows) if masks is not None else None
        if bitmask is None and all(run.plain[i] for i in rows):                  # plain greedy: the argmax
            tokens = row_argmax(logits)
            for i, t in zip(rows, tokens):
                drafts[i].append(t)
            if masks is not None:
                masks.advance(rows, tokens)
            return
        batch = self._sampling_batch(run, rows, bitmask)
        q = compute_probs(logits, batch)                  # [len(rows), vocab]; greedy rows one-hot at their argmax
        keys = self.sampler.keys([run.active[i][0].shadow for i in rows], [len(drafts[i]) for i in rows])
        coupled = self.sampler.rule is DrawRule.GUMBEL
        tokens = self.sampler.draws.draw(q, keys, self.sampler.rule,
                                         NoiseStream.TOKEN if coupled else NoiseStream.DRAFT).tolist()
        for j, i in enumerate(rows):
            drafts[i].append(tokens[j])
            if not coupled and not batch.greedy_rows[j]:
                run.probs[i].append(q[j])
        if masks is not None:
            masks.advance(rows, tokens)

    def _sampling_batch(self, run: _Run, rows: list[int], bitmask: torch.Tensor | None) -> SamplingBatch:
        """The rows' sampling filters, each seeing its drafts so far as output; built once per set of rows
        for a proposal when no row's filters depend on its output (``filters_ignore_output``)."""
        static = bitmask is None and all(run.static[i] for i in rows)
        key = tuple(rows)
        if static and key in run.batches:
            return run.batches[key]
        seqs = [run.active[i][0].shadow for i in rows]
        batch = self.sampler.build_batch(seqs, output_token_ids=[s.output_token_ids + run.drafts[i]
                                                                 for s, i in zip(seqs, rows)], grammar_bitmask=bitmask)
        if static:
            run.batches[key] = batch
        return batch

    def free(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            st = self._states.pop(seq_id, None)
            if st is not None:
                self.bm.free(st.shadow)

    @property
    def num_used_blocks(self) -> int:
        return self.bm.num_used_blocks
