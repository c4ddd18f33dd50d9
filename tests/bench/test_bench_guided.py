"""bench/bench_guided.py runs end to end on the demo model (behaviour only, no wall-clock goals)."""
from __future__ import annotations

import json

from bench import bench_guided


def test_bench_guided_runs_and_reports(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert bench_guided.main(["--rounds", "1", "--concurrency", "2", "--max-tokens", "12", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    t, = r["tpot"]
    assert t["requests"] == 2 and t["tpot_ratio"] > 0 and t["forward_passes_per_request_guided"] >= 1
    jf, = r["jump_forward"]
    assert jf["forward_passes_per_request_guided"] < jf["mean_output_tokens"]    # forced tokens saved passes
    assert {c["guide"] for c in r["compile"]} >= {"json", "bench:person"}
    assert all(c["cached_ms"] < c["cold_ms"] for c in r["compile"])
    assert "TPOT guided" in capsys.readouterr().out


def test_bench_guided_with_speculation_and_both_fills(tmp_path):
    out = tmp_path / "s.json"
    assert bench_guided.main(["--rounds", "2", "--concurrency", "2", "--max-tokens", "12", "--no-jump-forward",
                              "--speculative-method", "ngram", "--compare-fill", "--json", str(out)]) == 0
    t, = json.loads(out.read_text())["tpot"]
    assert t["spec_accepted_per_draft"] is not None and len(t["tpot_ratio_other_fill_per_round"]) == 2
