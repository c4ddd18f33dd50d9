"""bench/harness/sliced.py: closed loops on several engines stepped in time slices, on fake engines and a fake clock."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from bench.harness.sliced import run_sliced


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Out:
    request_id: str
    new_token_ids: list
    request_finished: bool = False
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class Item:
    prompt_ids: list
    params: int          # how many tokens the fake engine emits for it


class FakeEngine:
    """Each step costs ``step_cost + per_seq * running`` on the clock and emits ``tokens_per_step`` tokens to every
    running request; logs (name, clock) at each step and the most requests ever running at once."""

    def __init__(self, name, clock, log, step_cost=0.001, per_seq=0.0001, tokens_per_step=1):
        self.name, self.clock, self.log = name, clock, log
        self.step_cost, self.per_seq, self.tokens_per_step = step_cost, per_seq, tokens_per_step
        self.running = {}     # rid -> [left, callback]
        self.peak = 0
        self.steps = 0
        self.aborted = []

    def add_request(self, rid, prompt_ids, params, cb):
        self.running[rid] = [params, cb]
        self.peak = max(self.peak, len(self.running))

    def has_work(self):
        return bool(self.running)

    def abort(self, rid):
        self.aborted.append(rid)
        return True

    def step(self):
        self.log.append((self.name, self.clock.t))
        self.steps += 1
        self.clock.t += self.step_cost + self.per_seq * len(self.running)
        for rid, st in list(self.running.items()):
            if rid in self.aborted:
                del self.running[rid]
                st[1](Out(rid, [], True, "abort"))
                continue
            n = min(self.tokens_per_step, st[0])
            st[0] -= n
            done = st[0] == 0
            if done:
                del self.running[rid]
            st[1](Out(rid, list(range(n)), done, "length" if done else None))


def make(clock, log, **kinds):
    return {name: FakeEngine(name, clock, log, **kw) for name, kw in kinds.items()}


def test_every_engine_runs_every_item_at_the_concurrency_and_times_only_its_own_steps():
    clock, log = Clock(), []
    engines = make(clock, log, slow={"step_cost": 0.002}, fast={"step_cost": 0.001, "tokens_per_step": 4})
    items = [Item([1, 2], 8 + i) for i in range(6)]
    runs = run_sliced(engines, items, 2, slice_seconds=0.005, clock=clock)
    for name, eng in engines.items():
        records, seconds = runs[name]
        assert [r.tokens for r in records] == [8 + i for i in range(6)]
        assert all(r.end is not None and r.finish_reason == "length" for r in records)
        assert eng.peak == 2 and not eng.has_work()
        # its own time is the sum of its own steps' costs, not the other engine's
        expected = sum(eng.step_cost + eng.per_seq * n for n in _running_counts(eng, items, 2))
        assert seconds == pytest.approx(expected)
        assert records[-1].end == pytest.approx(seconds)   # stamped on its own clock
    assert runs["slow"][1] > 2 * runs["fast"][1]


def _running_counts(eng, items, concurrency):
    """What the fake engine had running at each of its steps (replays the closed loop)."""
    left = [it.params for it in items]
    nxt, live, counts = 0, [], []
    while nxt < len(items) or live:
        while len(live) < concurrency and nxt < len(items):
            live.append(nxt)
            nxt += 1
        counts.append(len(live))
        for i in list(live):
            left[i] -= min(eng.tokens_per_step, left[i])
            if left[i] == 0:
                live.remove(i)
    assert len(counts) == eng.steps
    return counts


def test_slices_alternate_in_the_given_order_and_last_about_the_slice():
    clock, log = Clock(), []
    engines = make(clock, log, a={"step_cost": 0.001, "per_seq": 0.0}, b={"step_cost": 0.001, "per_seq": 0.0})
    run_sliced(engines, [Item([1], 40)], 1, slice_seconds=0.005, order=["b", "a"], clock=clock)
    names = [n for n, _ in log]
    assert names[:15] == ["b"] * 5 + ["a"] * 5 + ["b"] * 5    # 5 steps of 1 ms fill a 5 ms slice
    assert names.count("a") == names.count("b") == 40


def test_the_clients_work_on_outputs_is_not_the_engines_time():
    clock, log = Clock(), []
    engines = make(clock, log, a={"step_cost": 0.001, "per_seq": 0.0})
    seen = []

    def client(name, out):
        seen.append((name, len(out.new_token_ids)))
        clock.t += 0.01                     # a slow consumer

    records, seconds = run_sliced(engines, [Item([1], 10)], 1, slice_seconds=0.005, clock=clock,
                                  on_output=client)["a"]
    assert seconds == pytest.approx(0.010) and len(seen) == 10
    assert [t for t, _ in records[0].events] == pytest.approx([0.001 * (i + 1) for i in range(10)])


def test_an_engine_past_its_time_is_aborted_and_freed_then_the_run_fails():
    clock, log = Clock(), []
    engines = make(clock, log, a={"step_cost": 0.001, "per_seq": 0.0})
    with pytest.raises(RuntimeError, match="a did not finish"):
        run_sliced(engines, [Item([1], 10_000), Item([1], 10_000)], 2, slice_seconds=0.005, clock=clock,
                   max_seconds=0.05)
    assert len(engines["a"].aborted) == 2 and not engines["a"].has_work()


def test_bad_arguments_and_started_engines_are_refused():
    clock, log = Clock(), []
    engines = make(clock, log, a={}, b={})
    with pytest.raises(ValueError, match="slice_seconds"):
        run_sliced(engines, [], 1, slice_seconds=0, clock=clock)
    with pytest.raises(ValueError, match="order"):
        run_sliced(engines, [], 1, order=["a", "a"], clock=clock)
    engines["b"].loop_alive = lambda: True
    with pytest.raises(ValueError, match=r"\['b'\] run their own loop thread"):
        run_sliced(engines, [], 1, clock=clock)


def test_real_engines_in_slices_count_every_token_and_free_every_block(demo_target):
    from backend.config import EngineConfig
    from backend.engine.llm_engine import LLMEngine
    from bench.bench_spec import Item as SpecItem
    from bench.bench_spec import measure_sliced
    from contracts.sampling_params import SamplingParams

    def engine(**kw):
        return LLMEngine(EngineConfig.from_settings(model_path=str(demo_target), device="cpu", cpu_threads=1,
                                                    kv_cache_bytes=16 << 20, **kw))

    engines = {"none": engine(), "ngram": engine(speculative_method="ngram")}
    prompt = [5, 6, 7, 8, 9, 10, 11, 12] * 4     # something to look up
    items = [SpecItem(prompt, SamplingParams(max_tokens=12, temperature=0.0)),
             SpecItem(prompt[3:], SamplingParams(max_tokens=9, temperature=0.0))]
    try:
        rows = measure_sliced(engines, items, 2, ["ngram", "none"], 0.002)
        for name, row in rows.items():
            assert row["output_tokens"] == 21 and row["errors"] == 0
            assert row["loop_cpu_s"] == row["seconds"] > 0
            assert engines[name].stats().kv_blocks_used == 0
        assert rows["ngram"]["draft_tokens"] > 0 and rows["none"]["draft_tokens"] == 0
        assert rows["ngram"]["steps"] < rows["none"]["steps"]
    finally:
        for e in engines.values():
            e.shutdown()
