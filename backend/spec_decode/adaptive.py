"""Adaptive draft length: choose each request's ``k`` from what speculation measurably buys.

For a sequence with per-position acceptance estimates ``a_1..a_K`` (exponential averages of "draft
``j`` accepted, given ``1..j-1`` were"), proposing ``k`` drafts yields ``1 + E(k)`` tokens per step,
``E(k) = sum_{i<=k} prod_{j<=i} a_j``. It costs its share of a step, ``t(n) / B`` for a step of ``n``
tokens over ``B`` decoding sequences, plus ``k`` extra verified tokens at the step's marginal cost per
token ``c`` and ``k`` draft-model steps at ``d`` each (0 for n-gram). The chosen ``k`` maximises

    (1 + E(k)) / (t(n) / B + k * (c + d))

``t`` and ``c`` come from a linear fit of measured step times against the step's token count (with
exponential forgetting), so where a step is compute-bound (large batches) extra verify tokens cost
as much as any other and ``k`` drops, possibly to 0. A sequence at ``k = 0`` is re-probed with the
full ``k`` every ``probe_every`` steps, so a change in acceptance is noticed. Until costs are known
``k`` is the maximum (and alternates with half of it, so the fit sees more than one step size).
"""
from __future__ import annotations

from dataclasses import dataclass, field

PRIOR_ACCEPTANCE = 0.9     # optimistic start: k starts at the maximum
ACCEPTANCE_DECAY = 0.3     # weight of a new acceptance observation
COST_DECAY = 0.97          # per-step forgetting of the step-time fit
PROBE_EVERY = 16           # steps at k = 0 before a probe with the full k


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


@dataclass
class StepCostFit:
    """Weighted least squares ``seconds = intercept + slope * num_tokens`` with exponential forgetting."""

    sw: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def observe(self, num_tokens: int, seconds: float) -> None:
        for name in ("sw", "sx", "sy", "sxx", "sxy"):
            setattr(self, name, getattr(self, name) * COST_DECAY)
        x = float(num_tokens)
        self.sw += 1.0
        self.sx += x
        self.sy += seconds
        self.sxx += x * x
        self.sxy += x * seconds

    def coefficients(self) -> tuple[float, float] | None:
        """(intercept, slope >= 0), or None while the step sizes seen do not pin a slope down."""
        if self.sw < 2.0:
            return None
        det = self.sw * self.sxx - self.sx * self.sx
        if det <= 1e-9 * self.sw * self.sxx:
            return None
        slope = max(0.0, (self.sw * self.sxy - self.sx * self.sy) / det)
        intercept = max(0.0, (self.sy - slope * self.sx) / self.sw)
        return intercept, slope


@dataclass
class _SeqState:
    acceptance: list[float]
    steps_at_zero: int = 0
    explore_flip: bool = False


@dataclass
class AdaptiveDraftLength:
    """Per-sequence draft length from measured acceptance and costs; ``enabled=False``: always the maximum."""

    max_k: int
    enabled: bool = True
    fit: StepCostFit = field(default_factory=StepCostFit)
    draft_seconds_per_token: float = 0.0    # exponential average, per sequence and draft token
    _seqs: dict[int, _SeqState] = field(default_factory=dict)

    def _state(self, seq_id: int) -> _SeqState:
        st = self._seqs.get(seq_id)
        if st is None:
            st = self._seqs[seq_id] = _SeqState([PRIOR_ACCEPTANCE] * self.max_k)
        return st

    def choose(self, seq_id: int, k_max: int, num_decoding: int) -> int:
        """Drafts to propose for one sequence this step (``k_max``: its own cap)."""
        if k_max <= 0:
            return 0
        if not self.enabled:
            return k_max
        st = self._state(seq_id)
        coef = self.fit.coefficients()
        if coef is None:                                   # costs unknown: full k, and half now and then
            st.explore_flip = not st.explore_flip
            return k_max if st.explore_flip or k_max == 1 else max(1, k_max // 2)
        intercept, slope = coef
        b = max(1, num_decoding)
        share = (intercept + slope * b) / b
        k = best_num_drafts(st.acceptance, k_max, share, slope + self.draft_seconds_per_token)
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

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        """A decode-only step (no prefill chunk) of ``num_tokens`` tokens took ``seconds``."""
        self.fit.observe(num_tokens, seconds)

    def observe_draft(self, seconds: float, num_draft_tokens: int) -> None:
        if num_draft_tokens > 0:
            x = seconds / num_draft_tokens
            self.draft_seconds_per_token += (x - self.draft_seconds_per_token) * (
                1.0 if self.draft_seconds_per_token == 0.0 else ACCEPTANCE_DECAY)

    def free(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            self._seqs.pop(seq_id, None)
