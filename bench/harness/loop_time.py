"""The engine loop thread's time in benchmarks: from ``LLMEngine.stats().loop`` in-process, or scraped from the
``llm`` model's ``triton_llm_engine_loop_seconds_total{state}`` counters on tritonserver's metrics port."""
from __future__ import annotations

import re
import urllib.request

from backend.engine.loop_clock import LoopTime
from backend.serving.metrics import LOOP_FAMILY

_SAMPLE = re.compile(LOOP_FAMILY + r"\{([^}]*)\}\s+(\S+)")


def parse_loop_seconds(text: str, model: str = "llm") -> LoopTime | None:
    """The loop seconds of ``model`` in a Prometheus text exposition (None: not published yet)."""
    got: dict[str, float] = {}
    for labels, value in _SAMPLE.findall(text):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if pairs.get("model") == model and "state" in pairs:
            got[pairs["state"]] = float(value)
    if "busy" not in got or "cpu" not in got:
        return None
    return LoopTime(got["busy"], got["cpu"], got.get("runqueue"))


def scrape_loop_seconds(metrics_url: str, model: str = "llm", timeout: float = 5.0) -> LoopTime | None:
    with urllib.request.urlopen(metrics_url, timeout=timeout) as resp:
        return parse_loop_seconds(resp.read().decode(), model)


def describe(t: LoopTime | None) -> str:
    """``busy 12.3 s: cpu 95.1%, run queue 3.2%, blocked 1.7%`` (shares of the busy time)."""
    if t is None:
        return "not measured"
    if t.busy_s <= 0:
        return "busy 0 s"
    rq = "run queue n/a" if t.runqueue_s is None else f"run queue {100 * t.runqueue_s / t.busy_s:.1f}%"
    return (f"busy {t.busy_s:.2f} s: cpu {100 * t.cpu_s / t.busy_s:.1f}%, {rq}, "
            f"blocked {100 * t.blocked_s / t.busy_s:.1f}%")


def as_dict(t: LoopTime | None) -> dict | None:
    if t is None:
        return None
    return {"busy_s": t.busy_s, "cpu_s": t.cpu_s, "runqueue_s": t.runqueue_s, "blocked_s": t.blocked_s}
