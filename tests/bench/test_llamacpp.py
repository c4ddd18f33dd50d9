"""bench/harness/llamacpp.py and bench_engine's llama.cpp section without llama.cpp: the output parser on captured
``llama-batched-bench`` output, the runner against a fake binary, the skip path, our decode rate."""
from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from bench.harness import llamacpp as lc
from bench.harness.stats import RequestRecord

DATA = Path(__file__).parent / "data"
JSONL = (DATA / "llama_batched_bench_jsonl.txt").read_text()
TABLE = (DATA / "llama_batched_bench_table.txt").read_text()


def test_parses_captured_jsonl_output_among_log_lines():
    rows = lc.parse_batched_bench(JSONL)
    assert [(r.pp, r.tg, r.pl) for r in rows] == [(64, 128, 1), (64, 128, 32)]
    first = json.loads(next(line for line in JSONL.splitlines() if line.startswith("{")))
    assert rows[0].speed_tg == first["speed_tg"] and rows[0].t_tg == first["t_tg"]
    assert rows[0].n_threads == first["n_threads"]
    for r in rows:  # S_TG is B * TG / T_TG by definition
        assert r.speed_tg == pytest.approx(r.pl * r.tg / r.t_tg, rel=1e-3)


def test_parses_captured_markdown_table():
    rows = lc.parse_batched_bench(TABLE)
    assert [(r.pp, r.tg, r.pl) for r in rows] == [(64, 128, 1), (64, 128, 32)]
    line = next(x for x in TABLE.splitlines() if x.startswith("|") and x.split("|")[3].strip() == "32")
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert rows[1].t_tg == float(cells[6]) and rows[1].speed_tg == float(cells[7])
    assert rows[1].n_threads is None


def test_parser_finds_nothing_in_a_failed_run():
    assert lc.parse_batched_bench("main: error: unable to load model\n|    PP |     TG |    B |\n") == []


def _fake_binary(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "llama-batched-bench"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_runner_passes_the_settings_and_keys_rows_by_batch(tmp_path):
    (tmp_path / "out.txt").write_text(JSONL)
    exe = _fake_binary(tmp_path, f'echo "$@" > {tmp_path}/args\ncat {tmp_path}/out.txt\n')
    llama = lc.LlamaCpp(exe, tmp_path / "m.gguf")
    rows = lc.run_batched_bench(llama, threads=2, prompt_tokens=64, gen_tokens=128, parallel=(1, 32))
    assert sorted(rows) == [1, 32] and rows[32].pl == 32
    args = (tmp_path / "args").read_text().split()
    flags = dict(zip(args[::2], args[1::2]))
    assert flags["-m"] == str(tmp_path / "m.gguf") and flags["-t"] == flags["-tb"] == "2"
    assert (flags["-npp"], flags["-ntg"], flags["-npl"]) == ("64", "128", "1,32")
    assert flags["-c"] == str(32 * (64 + 128)) and flags["--output-format"] == "jsonl"


def test_runner_raises_with_the_output_when_it_fails_or_misses_a_batch(tmp_path):
    exe = _fake_binary(tmp_path, 'echo "main: error: unable to load model" >&2\nexit 1\n')
    with pytest.raises(RuntimeError, match="unable to load model"):
        lc.run_batched_bench(lc.LlamaCpp(exe, tmp_path / "m.gguf"), threads=1, prompt_tokens=64, gen_tokens=128,
                             parallel=(1,))
    (tmp_path / "out.txt").write_text(JSONL)
    exe = _fake_binary(tmp_path, f"cat {tmp_path}/out.txt\n")
    with pytest.raises(RuntimeError, match=r"no row for batch sizes \[8\]"):
        lc.run_batched_bench(lc.LlamaCpp(exe, tmp_path / "m.gguf"), threads=1, prompt_tokens=64, gen_tokens=128,
                             parallel=(1, 8))


def test_locate_says_what_is_missing(tmp_path):
    model = tmp_path / "demo-target"
    got = lc.locate(model, env={}, root=tmp_path / "llamacpp")
    assert isinstance(got, lc.Skipped)
    assert "no llama-batched-bench executable" in got.reason and "tools/build_llamacpp.sh" in got.reason
    exe = _fake_binary(tmp_path, "exit 0\n")
    got = lc.locate(model, env={lc.BIN_ENV: str(exe)}, root=tmp_path / "llamacpp")
    assert isinstance(got, lc.Skipped) and "no GGUF" in got.reason
    assert str(tmp_path / "llamacpp" / "gguf" / "demo-target-f32.gguf") in got.reason
    not_executable = tmp_path / "plain"
    not_executable.write_text("")
    assert isinstance(lc.locate(model, str(not_executable), env={}, root=tmp_path), lc.Skipped)


def test_locate_finds_the_build_scripts_layout_and_explicit_paths(tmp_path):
    root = tmp_path / "llamacpp"
    (root / "gguf").mkdir(parents=True)
    exe = _fake_binary(root, "exit 0\n")
    gguf = lc.default_gguf(tmp_path / "random-82m", root)
    gguf.write_bytes(b"GGUF")
    assert lc.locate(tmp_path / "random-82m", env={}, root=root) == lc.LlamaCpp(exe, gguf)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF")
    assert lc.locate(tmp_path / "x", env={lc.GGUF_ENV: str(other)}, root=root) == lc.LlamaCpp(exe, other)
    assert lc.locate(tmp_path / "x", gguf=str(other), env={lc.GGUF_ENV: "/nowhere"}, root=root).gguf == other


def _record(first: float, step: float, tokens: int) -> RequestRecord:
    return RequestRecord(start=0.0, events=[(first + i * step, 1) for i in range(tokens)], end=first + tokens * step)


def test_decode_rate_counts_tokens_after_the_whole_wave_has_its_first_token():
    # one wave of 2: the second request gets its first token at t=2; from then on both decode at 10 tok/s each
    wave = [_record(1.0, 0.1, 21), _record(2.0, 0.1, 11)]
    # tokens after t=2: 10 of the first request (t=2.1..3.0), 10 of the second; window 2.0 -> 3.0
    assert lc.decode_tok_per_s([wave]) == pytest.approx(20.0)
    # two waves of 1 add tokens and seconds
    assert lc.decode_tok_per_s([[_record(0.5, 0.01, 101)], [_record(9.0, 0.02, 51)]]) == pytest.approx(150 / 2.0)


def test_decode_rate_refuses_waves_without_decode_steps():
    with pytest.raises(ValueError, match="waves"):
        lc.decode_tok_per_s([[RequestRecord(start=0.0)]])
    with pytest.raises(ValueError, match="waves"):
        lc.decode_tok_per_s([[_record(1.0, 0.1, 1)]])


def test_bench_engine_prints_the_skip_reason_and_records_it(tmp_path, capsys):
    from bench import bench_engine

    got = bench_engine.llamacpp_section("models/demo-target", None, [1], str(tmp_path / "missing"), None, tmp_path)
    printed = capsys.readouterr().out
    assert got == {"skipped": printed.strip()}
    assert "llama.cpp baseline skipped" in printed and str(tmp_path / "missing") in printed
    assert not list(tmp_path.iterdir())  # nothing measured, nothing plotted


def test_thread_ratios_pair_the_repeats():
    """2 threads / 1 thread per repeat that measured both (the repeats alternate the order of thread counts)."""
    from bench.bench_engine import thread_ratios
    rows = [{"threads": t, "batch": b, "repeat": rep, "ours_tok_s": tok}
            for t, b, rep, tok in [(1, 1, 0, 100.0), (2, 1, 0, 120.0), (2, 1, 1, 90.0), (1, 1, 1, 100.0),
                                   (1, 32, 0, 1000.0), (2, 32, 0, 1500.0), (1, 1, 2, 50.0)]]
    rows.append({"threads": 1, "batch": 1, "repeat": "median", "ours_tok_s": 100.0})
    assert thread_ratios(rows, 1) == [1.2, 0.9]       # repeat 2 measured only one thread count
    assert thread_ratios(rows, 32) == [1.5]
    assert thread_ratios(rows, 8) == []
