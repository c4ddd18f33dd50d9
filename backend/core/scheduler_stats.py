"""What the scheduler counts: ``SchedulerStats`` (a snapshot for ``LLMEngine.stats``) and ``SpecDecodeCounters``
(speculative decoding, cumulative)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SchedulerStats:
    num_running: int
    num_waiting: int               # sequences in the waiting queue (new or preempted)
    num_prefilling: int            # running sequences with more than one token left to compute
    num_scheduled: int             # sequences in the last step
    num_batched_tokens: int        # tokens in the last step
    num_preemptions: int           # cumulative
    num_kv_blocks: int
    num_free_blocks: int
    num_used_blocks: int
    num_cached_blocks: int
    prefix_cache_queries: int      # tokens, cumulative
    prefix_cache_hits: int         # tokens, cumulative
    spec: "SpecDecodeCounters"     # speculative decoding, cumulative


@dataclass
class SpecDecodeCounters:
    """Cumulative speculative-decoding counts (terms: backend/core/plan.py)."""

    num_drafts: int = 0                  # verifications of a sequence with at least one draft
    num_draft_tokens: int = 0            # draft tokens verified
    num_accepted_tokens: int = 0         # of which accepted
    accepted_per_pos: list[int] = field(default_factory=list)   # [j]: drafts accepted at position j (0-based)
    num_standby_steps: int = 0           # decode rounds for which the draft-length policy drafted nothing

    def record(self, num_drafts: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_pos) < num_drafts:
            self.accepted_per_pos.extend([0] * (num_drafts - len(self.accepted_per_pos)))
        for j in range(num_accepted):
            self.accepted_per_pos[j] += 1

    def snapshot(self) -> "SpecDecodeCounters":
        return SpecDecodeCounters(self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens,
                                  list(self.accepted_per_pos), self.num_standby_steps)
