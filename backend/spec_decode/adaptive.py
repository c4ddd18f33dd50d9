"""Adaptive draft length: each sequence's ``k`` maximises its expected tokens per second; ``k = 0`` where no
length pays.

Acceptance: per sequence and evidence class (the n-gram match length; greedy and sampled requests apart), the
probability ``a_j`` that draft ``j`` is accepted once drafts ``1..j-1`` were, an exponential mean over
verifications. A new sequence starts from its class's engine-wide mean, which starts at ``prior_acceptance``
(optimistic: the first requests draft, and so measure). ``k`` drafts are expected to yield ``E(k) = sum_{i<=k}
prod_{j<=i} a_j`` accepted tokens.

Costs (``step_costs.py``): ``t(B)`` a plain step over ``B`` sequences, ``x(B, k)`` the extra per speculating
sequence. A sequence's share of a plain step is ``t(B) / B``; it drafts the ``k`` maximising ``(1 + E(k)) /
(t(B) / B + x(B, k))`` when that beats ``B / t(B)``, else none.

The rules, each with its constant in ``AdaptiveConfig`` (0 or false switches it off):

- ``probe_budget``: now and then every candidate drafts its cap (a probe), so a sequence held at ``k = 0`` is seen
  again when its drafts start paying and the longest drafts' cost is measured again; probes are spaced so that
  they cost at most that fraction of the plain step time (``probe_interval``);
- ``plain_every``: after that many steps with drafts in a bucket, one step without, so ``t(B)`` follows the
  machine (a stale ``t`` makes drafts look cheaper and each saved step dearer);
- ``skip_idle``: a sampled sequence held at ``k = 0`` is not looked up between probes.

Until a bucket's ``t`` is measured its steps run without drafts; until its ``x`` is, every candidate drafts its cap.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from backend.spec_decode.policy import Candidate, StepRecord
from backend.spec_decode.step_costs import StepCosts, extras_upto


@dataclass(frozen=True)
class AdaptiveConfig:
    """Every tuning constant of the adaptive policy."""

    prior_acceptance: float = 0.9   # a new evidence class's per-position acceptance
    acceptance_weight: float = 0.2  # exponential-mean weight of one verification
    cost_weight: float = 0.2        # exponential-mean weight of one step time
    probe_budget: float = 0.02      # fraction of the plain step time probes may cost (0: never probe)
    plain_every: int = 64           # steps with drafts per bucket between plain ones (0: only unforced ones)
    skip_idle: bool = True          # no lookups for sampled sequences held at k = 0

    def __post_init__(self) -> None:
        for name in ("prior_acceptance", "acceptance_weight", "cost_weight", "probe_budget"):
            value = getattr(self, name)
            lowest_open = name != "probe_budget"
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not \
                    (0 < value <= 1 if lowest_open else 0 <= value <= 1):
                raise ValueError(f"{name}: expected a number in {'(' if lowest_open else '['}0, 1], got {value!r}")
        value = self.plain_every
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"plain_every: expected an integer >= 0, got {value!r}")
        if not isinstance(self.skip_idle, bool):
            raise ValueError(f"skip_idle: expected a boolean, got {self.skip_idle!r}")


def expected_accepted_by_length(acceptance: list[float]) -> list[float]:
    """``[E(1), E(2), ...]``: the expected accepted drafts of each length, with per-position conditional
    acceptance ``acceptance`` (each a running sum of running products)."""
    totals, total, run = [], 0.0, 1.0
    for a in acceptance:
        run *= a
        total += run
        totals.append(total)
    return totals


def expected_accepted(acceptance: list[float], k: int) -> float:
    """``E(k)``: the expected accepted drafts of ``k`` with per-position conditional acceptance ``acceptance``."""
    return expected_accepted_by_length(acceptance[:k])[-1] if k > 0 and acceptance else 0.0


def best_num_drafts(acceptance: list[float], share: float, extras: list[float]) -> int:
    """The ``k`` in ``[0, len(extras)]`` maximising ``(1 + E(k)) / (share + extras[k - 1])``, ``0`` unless that
    beats a plain step's ``1 / share``; ties go to the smaller ``k``."""
    best_k, best_rate = 0, 1 / share if share > 0 else 0.0
    for k, (accepted, x) in enumerate(zip(expected_accepted_by_length(acceptance), extras), 1):
        if share + x > 0 and (1 + accepted) / (share + x) > best_rate:
            best_k, best_rate = k, (1 + accepted) / (share + x)
    return best_k


def probe_interval(num_seqs: int, plain: float, extra: float, budget: float) -> float:
    """Rounds between probes of ``num_seqs`` sequences, each costing ``extra`` beyond a plain step of ``plain``
    seconds, for the probes to cost at most ``budget`` of the plain step time."""
    return num_seqs * extra / (budget * plain)


def update(estimate: list[float], num_drafts: int, num_accepted: int, weight: float) -> None:
    """One verification into per-position acceptance: positions up to the first rejection are observed."""
    for j in range(min(num_drafts, num_accepted + 1, len(estimate))):
        estimate[j] += weight * ((1.0 if j < num_accepted else 0.0) - estimate[j])


@dataclass
class AdaptiveDraftLength:
    """The adaptive ``DraftLengthPolicy`` (module docstring) for drafts of at most ``max_k``."""

    max_k: int
    config: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    costs: StepCosts = field(init=False)
    _classes: dict[int, list[float]] = field(default_factory=dict)              # cls -> engine-wide acceptance
    _seqs: dict[tuple[int, int], list[float]] = field(default_factory=dict)     # (seq_id, cls) -> acceptance
    _held: set[int] = field(default_factory=set)                                # seq_ids chosen k = 0 on merit
    _since_probe: int = 0                                                       # rounds since the last probe
    _probe_next: bool = False                                                   # the next round probes

    def __post_init__(self) -> None:
        self.costs = StepCosts(self.config.cost_weight)

    def acceptance(self, seq_id: int, cls: int) -> list[float]:
        """The sequence's per-position acceptance for drafts of class ``cls``."""
        st = self._seqs.get((seq_id, cls))
        if st is None:
            st = self._seqs[(seq_id, cls)] = list(self._class(cls))
        return st

    def _class(self, cls: int) -> list[float]:
        if cls not in self._classes:
            self._classes[cls] = [self.config.prior_acceptance] * self.max_k
        return self._classes[cls]

    def choose(self, num_decoding: int, candidates: list[Candidate]) -> list[int]:
        caps = [min(c.k_max, self.max_k) for c in candidates]
        b = self.costs.at(num_decoding)
        every = self.config.plain_every
        if not candidates or b.plain is None or (every > 0 and b.since_plain >= every):
            return [0] * len(candidates)                      # measure t(B)
        if not b.extra:
            return caps                                       # measure x(B, k)
        extras = extras_upto(b.extra, max(caps))
        budget, self._since_probe = self.config.probe_budget, self._since_probe + 1
        interval = probe_interval(num_decoding, b.plain, extras[-1], budget) if budget > 0 else None
        probe = interval is not None and self._since_probe >= interval
        if probe:
            self._since_probe = 0
        self._probe_next = interval is not None and self._since_probe + 1 >= interval
        if probe:
            self._held.difference_update(c.seq_id for c in candidates)
            return caps                                       # a probe
        share = b.plain / num_decoding
        ks = []
        for c, cap in zip(candidates, caps):
            k = best_num_drafts(self.acceptance(c.seq_id, c.cls)[:cap], share, extras[:cap])
            if k:
                self._held.discard(c.seq_id)
            else:
                self._held.add(c.seq_id)
            ks.append(k)
        return ks

    def idle(self, seq_id: int) -> bool:
        return self.config.skip_idle and seq_id in self._held and not self._probe_next

    def observe(self, step: StepRecord) -> None:
        w = self.config.acceptance_weight
        for v in step.verified:
            update(self.acceptance(v.seq_id, v.cls), v.num_drafts, v.num_accepted, w)
            update(self._class(v.cls), v.num_drafts, v.num_accepted, w)
        if not step.decode_only:                             # a prefill chunk's time is no decode step's
            return
        speculating = [v for v in step.verified if v.num_drafts]
        if not speculating:
            self.costs.observe_plain(step.num_seqs, step.seconds)
        else:
            self.costs.observe_speculative(step.num_seqs, len(speculating),
                                           max(v.num_drafts for v in speculating), step.seconds)

    def free(self, seq_ids: list[int]) -> None:
        gone = set(seq_ids)
        self._held -= gone
        for key in [key for key in self._seqs if key[0] in gone]:
            del self._seqs[key]
