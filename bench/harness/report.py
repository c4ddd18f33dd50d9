"""Printing, ratios against goals, the plot and the JSON of a benchmark run.

A side-by-side benchmark names its two sides (``Side``) and its goals in one ``Comparison``;
rows are the level dicts of ``bench.harness.closed_loop.sweep`` (``{"concurrency", <side key>: summary}``):

    CMP = Comparison(Side("spec", "spec", "speculative", "ngram speculation"),
                     Side("plain", "plain", "plain", "no speculation"), tpot_goal_max=0.8)
    print(CMP.header()); ...; CMP.print_level(row)       # one line per level
    r = CMP.ratios(rows); CMP.print_ratios(r)            # TPOT at the lowest level, tok/s at the highest
    CMP.plot(rows, out / "spec.png")
    write_json(out / "spec.json", {"levels": rows, "ratios": r, "machine": machine(load_before, note),
                                   "commit": git_commit(), ...})
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def fmt(x: float | None, spec: str = ".1f") -> str:
    """``x`` formatted, or "-" when there is no value."""
    return "-" if x is None else format(x, spec)


def quantiles(dist: dict, keys=("p50", "p90", "p99"), spec: str = ".1f") -> str:
    """``p50/p90/p99`` of a ``bench.harness.stats.dist_ms`` dict as one cell."""
    return "/".join(fmt(dist[k], spec) for k in keys)


@dataclass(frozen=True)
class Side:
    """One side of a comparison: its key in a level row, its column heading, its name in sentences, its legend."""

    key: str
    short: str
    name: str
    label: str


PIPELINE = Side("pipeline", "pipe", "pipeline", "Triton ensemble (gRPC stream)")
ENGINE = Side("engine", "eng", "in-process", "in-process LLMEngine")


@dataclass(frozen=True)
class Comparison:
    """Side ``a`` measured against baseline ``b``: TPOT p50 a/b at the lowest level (at most
    ``tpot_goal_max``), output tokens/s a/b at the highest level (at least ``throughput_goal_min``).
    A goal of None: the ratio is reported without a verdict."""

    a: Side = PIPELINE
    b: Side = ENGINE
    tpot_goal_max: float | None = None
    throughput_goal_min: float | None = None

    def header(self) -> str:
        a, b = self.a.short, self.b.short
        return (f"{'conc':>4} {'done':>7} {a + ' tok/s':>9} {b + ' tok/s':>9} {'ratio':>5} "
                f"{'TTFT p50/90/99 ms':>20} {'ITL p50/90/99 ms':>17} {f'TPOT p50 {a}/{b}':>15} "
                f"{'E2E p50/90/99 ms':>22}")

    def print_level(self, row: dict) -> None:
        """One line per level: side a's latencies, both sides' tokens/s and TPOT p50; then any errors."""
        p, e = row[self.a.key], row.get(self.b.key)
        ratio = p["tok_per_s"] / e["tok_per_s"] if e and e.get("tok_per_s") and p.get("tok_per_s") else None
        print(f"{row['concurrency']:>4} {p['completed']:>3}/{p['requests']:<3} {fmt(p['tok_per_s'], '.0f'):>9} "
              f"{fmt(e and e['tok_per_s'], '.0f'):>9} {fmt(ratio, '.2f'):>5} {quantiles(p['ttft_ms']):>20} "
              f"{quantiles(p['itl_ms']):>17} {fmt(p['tpot_ms']['p50'], '.2f'):>7}/"
              f"{fmt(e and e['tpot_ms']['p50'], '.2f'):<7} {quantiles(p['e2e_ms']):>22}", flush=True)
        for side, s in ((self.a, p), (self.b, e)):
            if s and s["errors"]:
                print(f"     {side.name} errors: {s['errors']} (first: {s['first_error']})", flush=True)

    def ratios(self, levels: list[dict]) -> dict[str, Any]:
        """``tpot_ratio`` at the lowest level and ``throughput_ratio`` at the highest with both sides."""
        a, b = self.a.key, self.b.key
        by = {row["concurrency"]: row for row in levels if row.get(b)}
        out: dict[str, Any] = {}
        if not by:
            return out
        lo, hi = min(by), max(by)
        a_tpot, b_tpot = by[lo][a]["tpot_ms"]["p50"], by[lo][b]["tpot_ms"]["p50"]
        if a_tpot and b_tpot:
            out["tpot_ratio"] = {"concurrency": lo, f"{a}_ms": a_tpot, f"{b}_ms": b_tpot,
                                 **goal(a_tpot / b_tpot, at_most=self.tpot_goal_max)}
        a_tps, b_tps = by[hi][a]["tok_per_s"], by[hi][b]["tok_per_s"]
        if a_tps and b_tps:
            out["throughput_ratio"] = {"concurrency": hi, f"{a}_tok_s": a_tps, f"{b}_tok_s": b_tps,
                                       **goal(a_tps / b_tps, at_least=self.throughput_goal_min)}
        return out

    def print_ratios(self, r: dict[str, Any]) -> None:
        a, b = self.a, self.b
        if "tpot_ratio" in r:
            t = r["tpot_ratio"]
            print(f"TPOT at concurrency {t['concurrency']}: {a.name} {t[a.key + '_ms']:.2f} ms / {b.name} "
                  f"{t[b.key + '_ms']:.2f} ms = {t['ratio']:.3f}{verdict(t)}")
        if "throughput_ratio" in r:
            t = r["throughput_ratio"]
            print(f"throughput at concurrency {t['concurrency']}: {a.name} {t[a.key + '_tok_s']:.0f} tok/s / "
                  f"{b.name} {t[b.key + '_tok_s']:.0f} tok/s = {t['ratio']:.3f}{verdict(t)}")

    def plot(self, levels: list[dict], path: Path) -> None:
        """TPOT p50 and TTFT p50 against output tokens/s, one point per level (labelled), both sides."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for side, style in ((self.a, "o-"), (self.b, "s--")):
            rows = [r for r in levels if r.get(side.key) and r[side.key].get("tok_per_s")]
            if not rows:
                continue
            x = [r[side.key]["tok_per_s"] for r in rows]
            for ax, key in zip(axes, ("tpot_ms", "ttft_ms")):
                y = [r[side.key][key]["p50"] for r in rows]
                ax.plot(x, y, style, label=side.label)
                for xi, yi, r in zip(x, y, rows):
                    if yi is not None:
                        ax.annotate(str(r["concurrency"]), (xi, yi), textcoords="offset points", xytext=(4, 4),
                                    fontsize=8)
        axes[0].set_ylabel("TPOT p50 (ms)")
        axes[1].set_ylabel("TTFT p50 (ms)")
        for ax in axes:
            ax.set_xlabel("output tokens/s (labels: concurrent requests)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"Latency vs throughput: same workload, {self.a.name} vs {self.b.name}")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def goal(ratio: float, *, at_most: float | None = None, at_least: float | None = None) -> dict[str, Any]:
    """``{"ratio", "goal_max" | "goal_min", "meets_goal"}`` (only ``ratio`` without a goal)."""
    out: dict[str, Any] = {"ratio": ratio}
    if at_most is not None:
        out |= {"goal_max": at_most, "meets_goal": ratio <= at_most}
    if at_least is not None:
        out |= {"goal_min": at_least, "meets_goal": ratio >= at_least}
    return out


def verdict(g: dict[str, Any]) -> str:
    """`` (goal <= 1.15: met)`` for a ``goal`` dict; empty without a goal."""
    if "goal_max" in g:
        return f" (goal <= {g['goal_max']}: {'met' if g['meets_goal'] else 'NOT met'})"
    if "goal_min" in g:
        return f" (goal >= {g['goal_min']}: {'met' if g['meets_goal'] else 'NOT met'})"
    return ""


def goal_verdict(point: float, interval: tuple[float, float] | None, target: float) -> str:
    """For a goal ``>= target`` measured as a median with a confidence interval (``stats.median_interval``):
    ``met`` / ``not met`` when the median's confidence interval lies wholly on one side of ``target``; otherwise
    the point estimate's side and ``within the noise`` (the measurement cannot tell)."""
    if interval is not None and interval[0] >= target:
        return "met"
    if interval is not None and interval[1] < target:
        return "not met"
    return ("met" if point >= target else "not met") + " at the median, within the noise"


# ---- the run's context and its JSON ---------------------------------------------------------------

def machine(load_before: tuple[float, float, float], note: str = "") -> dict[str, Any]:
    """CPU count, load average before (taken by the caller) and now, torch threads, autogroup, a free note."""
    return {"cpu_count": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "torch_threads": _torch_threads(), "sched_autogroup": _read("/proc/sys/kernel/sched_autogroup_enabled"),
            "note": note}


def print_load(m: dict[str, Any], seconds: float) -> None:
    print(f"load average before {m['loadavg_before'][0]:.1f}, after {m['loadavg_after'][0]:.1f} "
          f"({m['cpu_count']} CPUs); total {seconds:.0f} s")


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except Exception:
        return None


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def _torch_threads() -> int | None:
    try:
        import torch
        return torch.get_num_threads()
    except Exception:
        return None


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None
