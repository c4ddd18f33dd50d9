"""The speculation matrix's arithmetic (``bench/bench_spec.py``): combining rounds, the goals' verdicts, the
balanced turn orders, and what a batch-1 cell's measured costs and acceptance predict."""
from __future__ import annotations

import statistics

from bench.harness.report import goal_verdict
from bench.harness.stats import median_interval

GOALS = {("ngram", "repeat", 1, "greedy"): 2.0, ("draft", "mixed", 1, "greedy"): 1.3}
ADAPTIVE_FLOOR = 0.95


def turn_orders(n: int) -> list[list[int]]:
    """A balanced (Williams) Latin square of ``n`` engines' turns: over its rows every engine takes every position
    equally often, and follows every other engine equally often (``n`` rows for an even ``n``, ``2n`` for an odd
    one). Turn ``t`` of a cell takes row ``t % len(rows)``. Turns forward and backward instead would leave two
    engines always at the ends and two always in the middle, each always next to the same neighbours."""
    if n < 1:
        raise ValueError(f"turn_orders: need at least one engine, got {n}")
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:                      # 0, 1, n-1, 2, n-2, ...
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(j + i) % n for j in first] for i in range(n)]
    return rows if n % 2 == 0 else rows + [row[::-1] for row in rows]

def combine(rounds: list[dict]) -> dict:
    """One row from measurements (rounds over the same items, or a round's chunks): tok/s over the total time,
    counters and seconds summed, TPOT and TTFT their medians."""
    row = dict(rounds[-1])
    row["seconds"] = sum(r["seconds"] for r in rounds)
    row["tok_per_s"] = sum(r["tok_per_s"] * r["seconds"] for r in rounds) / row["seconds"]
    for key in ("tpot_ms_p50", "ttft_ms_p50"):
        row[key] = statistics.median(r[key] for r in rounds)
    for key in ("steps", "draft_tokens", "accepted_tokens", "errors", "output_tokens"):
        row[key] = sum(r[key] for r in rounds)
    cpu = [r["loop_cpu_s"] for r in rounds]
    row["loop_cpu_s"] = None if None in cpu else sum(cpu)
    row["cpu_tok_per_s"] = row["output_tokens"] / row["loop_cpu_s"] if row["loop_cpu_s"] else None
    verifies = sum(r["verifies"] for r in rounds)
    row["verifies"] = verifies
    row["acceptance_rate"] = row["accepted_tokens"] / row["draft_tokens"] if row["draft_tokens"] else None
    row["mean_accepted_length"] = 1 + row["accepted_tokens"] / verifies if verifies else 1.0
    return row

def cell_name(cell: dict) -> str:
    return f"{cell['method']} {cell['workload']} T={cell['temperature']:g} c={cell['concurrency']}"

def interval_text(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f" [90% CI of the median {ci[0]:.2f}-{ci[1]:.2f}]"

def goal_verdicts(cells: list[dict]) -> list[dict]:
    """The goals (``GOALS``, ``ADAPTIVE_FLOOR``) against the cells' median ratios and their 90% confidence intervals
    (``bench.harness.report.goal_verdict``: ``met`` / ``not met`` only where the interval lies on one side of the target). The
    floor's row reads the lowest adaptive cell and lists the cells whose whole interval lies below the floor."""
    verdicts = []

    def row(goal: str, cell: dict, target: float) -> dict:
        cpu = cell.get("cpu_ratio")
        return {"goal": goal, "cell": cell_name(cell), "ratio": cell["ratio"], "ratio_ci": cell.get("ratio_ci"),
                "target": target, "met": cell["ratio"] >= target,
                "verdict": goal_verdict(cell["ratio"], cell.get("ratio_ci"), target),
                "cpu_ratio": cpu, "cpu_ratio_ci": cell.get("cpu_ratio_ci"),
                "cpu_verdict": None if cpu is None else goal_verdict(cpu, cell.get("cpu_ratio_ci"), target)}

    for (m, wl, c, mode), goal in GOALS.items():
        for cell in cells:
            if (cell["method"], cell["workload"], cell["concurrency"], cell["temperature"] == 0.0) == \
                    (m, wl, c, mode == "greedy"):
                verdicts.append(row(f"{m} {wl} c={c} {mode} >= {goal}x", cell, goal))
    adaptive = [c for c in cells if c["method"] in ("ngram", "draft") and c["ratio"] is not None]
    if adaptive:
        lowest = min(adaptive, key=lambda c: c["ratio"])
        floor = row(f"adaptive >= {ADAPTIVE_FLOOR}x of none everywhere", lowest, ADAPTIVE_FLOOR)
        on_cpu = [c["cpu_ratio"] for c in adaptive if c.get("cpu_ratio") is not None]
        if on_cpu:   # the lowest cell on CPU time may be another one
            low_cpu = min((c for c in adaptive if c.get("cpu_ratio") is not None), key=lambda c: c["cpu_ratio"])
            floor.update(cpu_ratio=low_cpu["cpu_ratio"], cpu_ratio_ci=low_cpu.get("cpu_ratio_ci"),
                         cpu_verdict=goal_verdict(low_cpu["cpu_ratio"], low_cpu.get("cpu_ratio_ci"), ADAPTIVE_FLOOR))
        floor["clearly_below"] = [cell_name(c) for c in adaptive
                                  if c.get("ratio_ci") is not None and c["ratio_ci"][1] < ADAPTIVE_FLOOR]
        if not all(c.get("ratio_ci") for c in adaptive):   # a cell without an interval cannot be called clear
            floor["verdict"] = goal_verdict(lowest["ratio"], None, ADAPTIVE_FLOOR)
        elif floor["clearly_below"]:
            floor["verdict"] = "not met"
        else:   # met only if every cell's interval lies at or above the floor
            lows = [c["ratio_ci"][0] for c in adaptive]
            floor["verdict"] = "met" if min(lows) >= ADAPTIVE_FLOOR else \
                goal_verdict(lowest["ratio"], None, ADAPTIVE_FLOOR)
        verdicts.append(floor)
    return verdicts

def cost_summary(row: dict, bucket: int) -> str:
    """``plain 2.1 ms, +k1 0.9 +k4 2.0 ms/seq`` for one batch bucket (adaptive policy's measurements)."""
    plain = row.get("plain_step_ms", {}).get(bucket)
    extra = row.get("extra_ms_per_seq", {}).get(bucket, {})
    if plain is None:
        return ""
    return f"plain {plain:.2f} ms" + ("".join(f" +k{k} {v:.2f}" for k, v in extra.items()) + " ms/seq" if extra else "")

def geometric_accepted(a: float, k: int) -> float:
    """``E(k)`` with the same acceptance ``a`` at every position: ``a + a^2 + ... + a^k``."""
    return sum(a ** i for i in range(1, k + 1))

def solve_increasing(f, target: float) -> float | None:
    """The ``a`` in [0, 1] with ``f(a) = target`` for ``f`` increasing on [0, 1]; None if out of reach."""
    if f(1.0) < target:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return hi

def prefill_share(none_row: dict, max_tokens: int) -> float:
    """The share of a batch-1 request's time that is its prompt's prefill, from ``none``'s medians: ``TTFT / (TTFT
    + TPOT * (max_tokens - 1))``. Speculation does not shorten it."""
    ttft, tpot = none_row.get("ttft_ms_p50"), none_row.get("tpot_ms_p50")
    if not ttft or not tpot:
        return 0.0
    return ttft / (ttft + tpot * (max_tokens - 1))

def overall_speedup(decode_speedup: float, prefill: float) -> float:
    """Tokens/s ratio when decoding runs ``decode_speedup`` times faster and ``prefill`` of the time does not."""
    return 1.0 / (prefill + (1.0 - prefill) / decode_speedup)

def decode_speedup_for(goal: float, prefill: float) -> float | None:
    """The decode speed-up that makes ``overall_speedup`` reach ``goal`` (None: the prefill alone forbids it)."""
    return None if 1.0 / goal <= prefill else (1.0 - prefill) / (1.0 / goal - prefill)

def goal_analysis(measured: dict, fixed: dict | None, k_max: int, goal: float, prefill: float = 0.0) -> dict | None:
    """Why a batch-1 cell misses ``goal`` from its measured costs, acceptance and prefill share, and what would
    reach it.

    Costs at bucket 1 from ``measured`` (the fixed-k engine when there is one: it speculates every step, so its
    costs rest on the most steps): ``r_k = x(1, k) / t(1)``, the extra seconds of speculating with ``k``
    drafts (proposer included) per plain step; the decode speed-up with per-position acceptance ``a`` is
    ``(1 + E(k)) / (1 + r_k)``, and tokens/s also pay the prompts' prefill (``prefill`` of ``none``'s time,
    ``overall_speedup``). Acceptance ``a`` from the fixed-k engine's mean accepted length.
    """
    plain = measured.get("plain_step_ms", {}).get(1)
    extra = measured.get("extra_ms_per_seq", {}).get(1, {})
    if not plain or not extra:
        return None
    ratio = {k: x / plain for k, x in extra.items()}
    need = decode_speedup_for(goal, prefill)
    out: dict = {"plain_step_ms": plain, "extra_per_plain_step": ratio, "prefill_share": prefill,
                 "decode_speedup_for_goal": need}
    if fixed is not None and fixed["draft_tokens"]:
        a = solve_increasing(lambda v: geometric_accepted(v, k_max), fixed["mean_accepted_length"] - 1) or 1.0
        out["per_position_acceptance"] = a
        out["predicted_speedup"] = {k: overall_speedup((1 + geometric_accepted(a, k)) / (1 + r), prefill)
                                    for k, r in ratio.items()}
        out["max_extra_for_goal"] = {k: max(0.0, (1 + geometric_accepted(a, k)) / need - 1) if need else None
                                     for k in ratio}
    out["acceptance_for_goal"] = {k: solve_increasing(lambda v, k=k: 1 + geometric_accepted(v, k), need * (1 + r))
                                  if need else None for k, r in ratio.items()}
    out["best_with_every_draft_accepted"] = max(overall_speedup((1 + k) / (1 + r), prefill) for k, r in ratio.items())
    return out

def rounded(value):
    """``value`` with its floats to 2 decimals (dicts and lists walked), for printing."""
    if isinstance(value, float):
        return round(value, 2)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


def paired_rows(runs: dict[str, list[dict]], one_thread: bool) -> dict[str, dict]:
    """Each method's rounds combined, with its ratios to ``none`` measured next to it, round by round (their median
    is robust to another process slowing one round down): tokens/s (``ratio``, with its 90% interval), decode speed
    alone (``decode_ratio``: median TPOT of ``none`` over the method's, prefill left out) and, with one thread, tokens
    per second of the loop thread's CPU time (``cpu_ratio``)."""
    base_runs = runs.get("none", [])
    rows = {m: combine(rs) for m, rs in runs.items()}
    base = rows["none"]["tok_per_s"] if "none" in rows else None
    for m, r in rows.items():
        paired = [x["tok_per_s"] / b["tok_per_s"] for x, b in zip(runs[m], base_runs)]
        decode = [b["tpot_ms_p50"] / x["tpot_ms_p50"] for x, b in zip(runs[m], base_runs)]
        cpu = [x["cpu_tok_per_s"] / b["cpu_tok_per_s"] for x, b in zip(runs[m], base_runs)
               if x["cpu_tok_per_s"] and b["cpu_tok_per_s"]] if one_thread else []
        r.update(ratio=statistics.median(paired) if paired else None, round_ratios=paired,
                 cpu_ratio=statistics.median(cpu) if cpu else None, cpu_round_ratios=cpu,
                 ratio_ci=median_interval(paired) if paired else None,
                 cpu_ratio_ci=median_interval(cpu) if cpu else None,
                 decode_ratio=statistics.median(decode) if decode else None,
                 pooled_ratio=r["tok_per_s"] / base if base else None)
    return rows


def cell_line(r: dict, batch_bucket: int) -> str:
    """One printed row of the matrix."""
    acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
    spread = f"[{min(r['round_ratios']):.2f}-{max(r['round_ratios']):.2f}]" if r["round_ratios"] else ""
    ci = r["ratio_ci"]
    spread += f" ci {ci[0]:.2f}-{ci[1]:.2f}" if ci and r["method"] != "none" else ""
    cpu = r["cpu_round_ratios"]
    on_cpu = f"cpu x{r['cpu_ratio']:4.2f} [{min(cpu):.2f}-{max(cpu):.2f}]" if cpu else ""
    return (f"{r['workload']:6s} T={r['temperature']:.1f} c={r['concurrency']:<3d} {r['method']:12s} "
            f"{r['tok_per_s']:8.1f} tok/s  x{(r['ratio'] or 0):5.2f} {spread:21s} {on_cpu:22s} "
            f"decode x{(r['decode_ratio'] or 0):4.2f}  accepted len {r['mean_accepted_length']:.2f}  "
            f"acceptance {acc}  steps {r['steps']}  {cost_summary(r, batch_bucket)}")
