"""Whether speculating pays at all, judged from the engine's realized throughput: the adaptive policy's safety net.

The adaptive draft length (adaptive.py) predicts what drafts buy from a model: per-position acceptance and measured
step costs. A model can be wrong where it cannot see: costs measured while the machine ran at another speed (on a
shared host a decode step's time moves by 2-3x over seconds), the speculator's own bookkeeping, the steps with
prefill chunks it does not observe. Measured with ``bench_spec.py``, n-gram speculation on sampled requests (few
drafts accepted) read 0.88-0.94x of no speculation in four of six cells.

So the speculator runs in *epochs* of ``epoch_steps(B)`` decode steps, each in one of two *arms*: **on** (the
speculator and its policy as usual) or **off** (the speculator does nothing: no lookups, no drafts, no policy work).
An epoch's *goodput* is the tokens it emitted per second of its decode steps, the speculator's own time included.
Steps with prefill chunks are left out: both arms prefill the same requests, and a 300-token chunk takes as long as
20 decode steps at batch 1, so an epoch with one and an epoch without would differ by far more than speculation
makes them differ. The machine's speed drifts, so only neighbours compare: consecutive epochs of one arm in one
batch-size bucket are pooled into a *run* (the tokens over the seconds of all of them: the drafts' acceptance moves
with the text, from one part of a request to the next, and one epoch of speculation is a noisy sample of it), and a
run that follows a run of the other arm gives one sample of ``log(goodput_on / goodput_off)``. The samples' running
mean per bucket (an average over the first ``SETTLE`` samples, then weight ``SAMPLE_WEIGHT``) chooses the arm,
changing it only when the mean is past ``HYSTERESIS`` on the other side of 0 (where the arms are that close, either
will do, and noisy samples would otherwise flip the choice back and forth, each flip costing a transition step).
Until a bucket has ``SETTLE`` samples the arms alternate (on first), unless its first sample is *decisive*:
speculating ``DECISIVE`` (1.5x) faster or more, which noise between neighbouring epochs does not produce (on greedy
``repeat`` at batch 1 the samples read 1.6-5x; where speculation costs, 0.6-0.95x). Then the second epoch without
speculation is skipped: at batch 1 on ``repeat`` the settling had run 66 steps without speculation in a 16-request
round. Only that way round: the first epoch with speculation carries the engine's one-off costs (its first verify
steps, the policy measuring its costs), so a first sample against speculation is biased against it, and settling
on it alone would keep speculation off for the ~40 epochs a re-try's budget allows. After that the other arm is
tried again for one epoch after ``EXPLORE_EVERY`` epochs of the chosen one, which yields two samples (the runs
before and after it bracket it); the interval doubles up to ``EXPLORE_MAX`` while the re-tries confirm the choice,
and returns to ``EXPLORE_EVERY`` when a re-try's own sample disagrees with it, before the mean has moved: after a change of
workload (greedy code, where speculating doubled throughput, then sampled prose, where it costs 10%) the mean needs
several samples to cross over, and at the longest interval they would take thousands of steps. The interval is
never shorter than what keeps re-tries of a settled or confirmed choice within ``EXPLORE_BUDGET`` of the throughput
(``retry_floor``): where speculating doubles throughput, each re-try epoch loses half an epoch, and on greedy
``repeat`` at batch 1 the settling and the re-tries at 4, 8 and 16 epochs had run 160-190 of ~2,200 steps without
speculation. A disagreeing re-try still resets the interval, so a change of workload is followed as fast. The first step of an
epoch is not measured: it still verifies the drafts the other arm proposed (or has none proposed yet); after an
epoch without speculation, the first ``WARMUP_STEPS`` are not: the proposer catches up with the tokens it did not
see, the policy (woken from any doze) decides afresh, and only the step after a proposal verifies anything. With
only the first step unmeasured and the policy's doze carried over, the governor chose no speculation on greedy
``mixed`` requests at batch 1, where speculating ran 1.33x faster (it read 0.98x of no speculation; with the warm-
up, 1.23x). An epoch cut short by a change of batch-size bucket is dropped if it measured fewer than half its steps.
An epoch is ``EPOCH_STEPS`` steps at batch 1 and shorter at larger batches (down to ``MIN_EPOCH_STEPS``): a step of
many sequences averages their drafts' fortunes already, and at batch 32 (8 ms a step on the demo target) 32-step
epochs put the longest re-try interval ten seconds apart, longer than a benchmark cell, so a bucket that had chosen
wrongly before a change of workload kept its choice.

Steps with a sampled request and steps of greedy requests only are judged apart (each batch-size bucket twice):
speculating pays very differently for them (on ``mixed`` at batch 32, n-gram drafts ran 1.15x with greedy requests
and 0.63x with sampled ones), and a bucket that had chosen no speculation in a sampled workload kept it through the
greedy one that followed.

Disabled (``speculative_adaptive`` false, a fixed ``k``): always on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from backend.core.buckets import bucket

EPOCH_STEPS = 32      # decode steps per epoch at batch 1 (epoch_steps)
MIN_EPOCH_STEPS = 8   # ... and at least, at any batch size
SETTLE = 2            # samples per bucket before the arm is chosen by them (the arms alternate until then)
DECISIVE = math.log(1.5)   # ... or one, when it says speculating is this much faster (log ratio)
SAMPLE_WEIGHT = 0.25  # weight of a new sample once a bucket has a few
EXPLORE_EVERY = 4     # epochs of the chosen arm before the other is tried again
EXPLORE_MAX = 32      # the interval doubles up to this while the re-tries confirm the choice
HYSTERESIS = 0.02     # |log ratio| past which the choice changes sides
WARMUP_STEPS = 4      # unmeasured steps of an epoch with speculation after one without
EXPLORE_BUDGET = 0.01  # re-tries of a confirmed choice cost at most this fraction of the throughput (retry_floor)
EXPLORE_FLOOR_MAX = 128   # ... so the interval is at least that many epochs, up to this


def epoch_steps(batch_bucket: int) -> int:
    """Decode steps per epoch for a batch-size bucket: ``EPOCH_STEPS / B``, at least ``MIN_EPOCH_STEPS``."""
    return max(MIN_EPOCH_STEPS, EPOCH_STEPS // batch_bucket)


def retry_floor(log_ratio: float) -> int:
    """Epochs between re-tries of the arm not chosen below which they would cost more than ``EXPLORE_BUDGET`` of the
    throughput: a re-try epoch loses ``1 - exp(-|log_ratio|)`` of an epoch's tokens (at most ``EXPLORE_FLOOR_MAX``)."""
    return min(EXPLORE_FLOOR_MAX, math.ceil((1.0 - math.exp(-abs(log_ratio))) / EXPLORE_BUDGET))


def log_goodput_ratio(on_tokens_per_second: float, off_tokens_per_second: float) -> float:
    """One sample: ``log(goodput_on / goodput_off)``; > 0 when speculating is faster."""
    return math.log(on_tokens_per_second / off_tokens_per_second)


@dataclass
class _Epoch:
    on: bool
    bucket: int
    index: int
    sampled: bool = False   # its steps have a sampled request (judged apart from greedy steps)
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    unmeasured: int = 1   # leading steps not measured (``WARMUP_STEPS`` for speculation after an epoch without)


@dataclass
class _Run:
    """Consecutive measured epochs of one arm in one bucket, pooled."""
    on: bool
    first: int          # epoch index of its first epoch
    last: int           # ... of its last
    tokens: int
    seconds: float

    @property
    def goodput(self) -> float:
        return self.tokens / self.seconds


@dataclass
class _Bucket:
    log_ratio: float = 0.0     # running mean of log(goodput_on / goodput_off)
    samples: int = 0
    choice: bool = True        # the arm the samples choose
    run: _Run | None = None    # the run going on
    prev_run: _Run | None = None   # the one before it
    explore_every: int = EXPLORE_EVERY
    since_explore: int = 0     # epochs of the chosen arm since the other one ran
    exploring: bool = False    # the epoch going on tries the other arm
    to_confirm: bool | None = None   # the choice a re-try's sample is to confirm (None: none pending)
    settled: bool = False      # the samples choose the arm (``SETTLE`` of them, or one ``DECISIVE`` one)

    def add_sample(self, x: float) -> None:
        self.samples += 1
        weight = max(SAMPLE_WEIGHT, 1.0 / self.samples)
        self.log_ratio += weight * (x - self.log_ratio)
        if self.to_confirm is not None:             # a re-try's sample: its own sign says whether it confirms
            confirmed = (x >= 0.0) == self.to_confirm
            self.explore_every = max(min(EXPLORE_MAX, 2 * self.explore_every), retry_floor(self.log_ratio)) \
                if confirmed else EXPLORE_EVERY
            self.to_confirm = None
        elif not self.settled and (self.samples >= SETTLE or self.log_ratio >= DECISIVE):
            self.settled = True                     # re-tries no more often than their budget allows
            self.explore_every = max(EXPLORE_EVERY, retry_floor(self.log_ratio))
        if abs(self.log_ratio) > HYSTERESIS or self.samples <= SETTLE:
            self.choice = self.log_ratio >= 0.0

    def add_epoch(self, ep: _Epoch) -> None:
        """A measured epoch: it extends the run going on, or ends it and starts one; an ended run next to a run of
        the other arm gives a sample."""
        run = self.run
        if run is not None and run.on == ep.on and run.last == ep.index - 1:
            run.last, run.tokens, run.seconds = ep.index, run.tokens + ep.tokens, run.seconds + ep.seconds
            return
        if run is not None:
            prev = self.prev_run
            if prev is not None and prev.on != run.on and prev.last == run.first - 1:
                on, off = (run, prev) if run.on else (prev, run)
                self.add_sample(log_goodput_ratio(on.goodput, off.goodput))
            self.prev_run = run
        self.run = _Run(ep.on, ep.index, ep.index, ep.tokens, ep.seconds)


@dataclass
class SpeculationGovernor:
    """The arm of each epoch, from the goodput of the epochs so far. The speculator asks ``speculating()`` at each
    round and reports every engine step to ``observe``."""

    enabled: bool = True
    _buckets: dict[tuple[int, bool], _Bucket] = field(default_factory=dict)   # (bucket, sampled) -> its state
    _epoch: _Epoch | None = None
    _epochs: int = 0

    def speculating(self) -> bool:
        """The current epoch's arm (on while nothing is known, and always when disabled)."""
        return not self.enabled or self._epoch is None or self._epoch.on

    def observe(self, num_seqs: int, tokens: int, seconds: float, sampled: bool = False) -> None:
        """A decode step over ``num_seqs`` sequences emitted ``tokens`` and took ``seconds`` (the speculator's time
        in it included); ``sampled``: some of them sample (steps with and without are judged apart)."""
        if not self.enabled or num_seqs <= 0:
            return
        b = bucket(num_seqs)
        ep = self._epoch
        if ep is None or ep.bucket != b or ep.sampled != sampled:
            self._close()
            ep = self._start(b, sampled)
        if ep.unmeasured:
            ep.unmeasured -= 1
        else:
            ep.steps += 1
            ep.tokens += tokens
            ep.seconds += seconds
        if ep.steps >= epoch_steps(b):
            self._close()
            self._start(b, sampled)

    def _close(self) -> None:
        ep, self._epoch = self._epoch, None
        if ep is not None and 2 * ep.steps >= epoch_steps(ep.bucket) and ep.seconds > 0.0 and ep.tokens > 0:
            self._buckets[(ep.bucket, ep.sampled)].add_epoch(ep)

    def _start(self, b: int, sampled: bool = False) -> _Epoch:
        st = self._buckets.setdefault((b, sampled), _Bucket())
        if not st.settled:
            on = st.run is None or not st.run.on          # alternate, on first
        elif st.exploring:                                # back from trying the other arm
            st.exploring, st.since_explore = False, 0
            on = st.choice
        elif st.since_explore >= st.explore_every:        # try the other arm for one epoch
            st.exploring, st.to_confirm = True, st.choice
            on = not st.choice
        else:
            st.since_explore += 1
            on = st.choice
        self._epochs += 1
        warmup = WARMUP_STEPS if on and st.run is not None and not st.run.on else 1
        self._epoch = _Epoch(on=on, bucket=b, sampled=sampled, index=self._epochs, unmeasured=warmup)
        return self._epoch

    def woke(self) -> bool:
        """Whether the epoch going on speculates after one that did not (the speculator then wakes its policy)."""
        ep = self._epoch
        return ep is not None and ep.on and ep.unmeasured == WARMUP_STEPS

    def snapshot(self, sampled: bool = False) -> dict[int, dict]:
        """Per bucket, of steps with a sampled request or of greedy ones: the running ``log_ratio``, its ``samples``
        and the arm it chooses (for benchmarks and logs)."""
        return {b: {"log_ratio": st.log_ratio, "samples": st.samples, "on": st.choice}
                for (b, s), st in sorted(self._buckets.items()) if s == sampled}
