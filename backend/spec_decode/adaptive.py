"""Adaptive draft length: choose each request's ``k`` from what speculation measurably buys.

For a sequence with per-position acceptance estimates ``a_1..a_K`` (exponential averages of "draft
``j`` accepted, given ``1..j-1`` were"), proposing ``k`` drafts yields ``1 + E(k)`` tokens per step,
``E(k) = sum_{i<=k} prod_{j<=i} a_j``. It costs its share of a plain decode step, ``t(B) / B`` with
``B`` decoding sequences, plus ``k`` times the measured extra cost of a draft token in a verify step
``m(B)`` and ``k`` times the proposer's cost per draft token ``d`` (about 0 for n-gram). The chosen
``k`` maximises

    (1 + E(k)) / (t(B) / B + k * (m(B) + d))

``t`` and ``m`` are measured per batch-size bucket (powers of two): ``t`` from decode steps without
drafts, ``m`` as (verify step time - ``t``) / drafts in the step, so it includes everything a verify
step costs beyond a plain one (more tokens in the forward, the rejection sampling). Where a step is
compute-bound (large batches) extra verify tokens cost as much as any other and ``k`` drops, possibly
to 0. To keep ``t`` current while everyone speculates, the engine runs one step without drafts when
a bucket's plain time is unknown or stale (``plain_step_due``). A sequence at ``k = 0`` is re-probed
with the full ``k`` every ``PROBE_EVERY`` steps, so a change in acceptance is noticed.

A new sequence starts from the engine-wide acceptance estimates (exponential averages over every
verification), which themselves start optimistic: the engine's first requests speculate with the
full ``k``, and a workload where drafts fail stops paying for them from one request to the next
instead of relearning it in every request.
"""
from __future__ import annotations

from dataclasses import dataclass, field

PRIOR_ACCEPTANCE = 0.9     # optimistic start: k starts at the maximum
ACCEPTANCE_DECAY = 0.3     # weight of a new acceptance observation (per sequence)
GLOBAL_DECAY = 0.05        # the same, engine-wide
COST_DECAY = 0.2           # weight of a new step-time observation
PROBE_EVERY = 16           # steps at k = 0 before a probe with the full k
PLAIN_EVERY = 64           # speculative steps in a bucket before its plain step time is measured again


def expected_accepted(acceptance: list[float], k: int) -> float:
    """``E(k) = sum_{i<=k} prod_{j<=i} a_j``: expected accepted drafts when proposing ``k``."""
    total, run = 0.0, 1.0
    for a in acceptance[:k]:
        run *= a
        total += run
    return total


def best_num_drafts(acceptance: list[float], k_max: int, step_share: float, cost_per_draft: float) -> int:
    """The ``k`` in ``[0, k_max]`` maximising expected tokens per second (ties: the smaller ``k``)."""
    best_k, best_rate = 0, 1.0 / step_share if step_share > 0 else float("inf")
    for k in range(1, k_max + 1):
        rate = (1.0 + expected_accepted(acceptance, k)) / (step_share + k * cost_per_draft)
        if rate > best_rate * (1 + 1e-6):
            best_k, best_rate = k, rate
    return best_k


def bucket(num_seqs: int) -> int:
    """Batch-size bucket: the power of two at or above ``num_seqs``."""
    return 1 << max(0, num_seqs - 1).bit_length()


@dataclass
class StepCosts:
    """Measured step costs per batch-size bucket: plain decode steps, and the extra per draft token."""

    plain: dict[int, float] = field(default_factory=dict)       # bucket -> seconds of a decode step without drafts
    per_draft: dict[int, float] = field(default_factory=dict)   # bucket -> extra seconds per verified draft
    since_plain: dict[int, int] = field(default_factory=dict)   # bucket -> speculative steps since a plain one

    def observe(self, num_seqs: int, num_drafts: int, seconds: float) -> None:
        b = bucket(num_seqs)
        if num_drafts == 0:
            self.plain[b] = _ema(self.plain.get(b), seconds)
            self.since_plain[b] = 0
            return
        self.since_plain[b] = self.since_plain.get(b, 0) + 1
        if b in self.plain:
            extra = max(0.0, seconds - self.plain[b]) / num_drafts
            self.per_draft[b] = _ema(self.per_draft.get(b), extra)

    def plain_step_due(self, num_seqs: int) -> bool:
        b = bucket(num_seqs)
        return b not in self.plain or self.since_plain.get(b, 0) >= PLAIN_EVERY

    def estimate(self, num_seqs: int) -> tuple[float, float] | None:
        """(plain step seconds at ``num_seqs``, extra seconds per draft), or None while unmeasured."""
        b = bucket(num_seqs)
        if b not in self.plain or b not in self.per_draft:
            return None
        return self.plain[b], self.per_draft[b]


def _ema(old: float | None, new: float) -> float:
    return new if old is None else old + COST_DECAY * (new - old)


@dataclass
class _SeqState:
    acceptance: list[float]
    steps_at_zero: int = 0


@dataclass
class AdaptiveDraftLength:
    """Per-sequence draft length from measured acceptance and costs; ``enabled=False``: always the maximum."""

    max_k: int
    enabled: bool = True
    costs: StepCosts = field(default_factory=StepCosts)
    draft_seconds_per_token: float = 0.0    # exponential average, per sequence and draft token
    global_acceptance: list[float] = field(default_factory=list)   # engine-wide per-position estimates
    _seqs: dict[int, _SeqState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.global_acceptance:
            self.global_acceptance = [PRIOR_ACCEPTANCE] * self.max_k

    def _state(self, seq_id: int) -> _SeqState:
        st = self._seqs.get(seq_id)
        if st is None:
            st = self._seqs[seq_id] = _SeqState(list(self.global_acceptance))
        return st

    def choose(self, seq_id: int, k_max: int, num_decoding: int) -> int:
        """Drafts to propose for one sequence this step (``k_max``: its own cap)."""
        if k_max <= 0:
            return 0
        if not self.enabled:
            return k_max
        st = self._state(seq_id)
        est = self.costs.estimate(max(1, num_decoding))
        if est is None:                                    # costs unknown: speculate fully to measure them
            return k_max
        plain, per_draft = est
        k = best_num_drafts(st.acceptance, k_max, plain / max(1, num_decoding), per_draft + self.draft_seconds_per_token)
        if k == 0:
            st.steps_at_zero += 1
            if st.steps_at_zero >= PROBE_EVERY:
                st.steps_at_zero = 0
                return k_max
        else:
            st.steps_at_zero = 0
        return k

    def observe_verify(self, seq_id: int, num_drafts: int, num_accepted: int) -> None:
        """Draft ``j <= num_accepted`` was accepted; draft ``num_accepted + 1`` (if any) was rejected."""
        acc = self._state(seq_id).acceptance
        for j in range(min(num_drafts, num_accepted + 1, len(acc))):
            hit = 1.0 if j < num_accepted else 0.0
            acc[j] += ACCEPTANCE_DECAY * (hit - acc[j])
            self.global_acceptance[j] += GLOBAL_DECAY * (hit - self.global_acceptance[j])

    def observe_step(self, num_seqs: int, num_drafts: int, seconds: float) -> None:
        """A decode-only step (no prefill chunk) over ``num_seqs`` sequences verifying ``num_drafts`` took ``seconds``."""
        self.costs.observe(num_seqs, num_drafts, seconds)

    def plain_step_due(self, num_decoding: int) -> bool:
        """Whether the next step should run without drafts, to measure a plain step at this batch size."""
        return self.enabled and self.costs.plain_step_due(max(1, num_decoding))

    def observe_draft(self, seconds: float, num_draft_tokens: int) -> None:
        if num_draft_tokens > 0:
            x = seconds / num_draft_tokens
            self.draft_seconds_per_token += (x - self.draft_seconds_per_token) * (
                1.0 if self.draft_seconds_per_token == 0.0 else ACCEPTANCE_DECAY)

    def free(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            self._seqs.pop(seq_id, None)
