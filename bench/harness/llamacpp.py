"""llama.cpp as an optional baseline: find the built ``llama-batched-bench`` and the GGUF, run it, parse it.

``tools/build_llamacpp.sh MODEL_DIR`` builds the binary (from the llama.cpp sources vendored in the
``llama-cpp-python`` sdist) into ``.cache/llamacpp/llama-batched-bench`` and converts the checkpoint to
``.cache/llamacpp/gguf/<folder name>-f32.gguf``. ``locate`` finds both (or takes explicit paths, e.g. from
``LLAMACPP_BIN`` / ``LLAMACPP_GGUF``) and says why not when it cannot: the baseline is then skipped with that
reason, never faked.

``llama-batched-bench`` prefills ``B`` random prompts of ``PP`` tokens, then decodes ``TG`` steps of ``B``
tokens (no sampling); its ``S_TG`` is ``B * TG / T_TG``. ``decode_tok_per_s`` measures our side the same
way: output tokens after every sequence of the wave has its first token, over the time from then to the
last token.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.harness.stats import RequestRecord

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DIR = REPO / ".cache" / "llamacpp"
BIN_ENV, GGUF_ENV = "LLAMACPP_BIN", "LLAMACPP_GGUF"
BUILD_HINT = "build it with: tools/build_llamacpp.sh {model}"


@dataclass(frozen=True)
class LlamaCpp:
    """A built ``llama-batched-bench`` and the GGUF conversion of the benchmarked checkpoint."""

    binary: Path
    gguf: Path


@dataclass(frozen=True)
class Skipped:
    """Why the llama.cpp baseline does not run (printed instead of its numbers)."""

    reason: str


@dataclass(frozen=True)
class BatchedBenchRow:
    """One result line of ``llama-batched-bench``: ``pl`` sequences, ``pp`` prompt and ``tg`` generated tokens each."""

    pp: int
    tg: int
    pl: int
    t_pp: float      # seconds of the prefill
    speed_pp: float  # prompt tokens/s
    t_tg: float      # seconds of the ``tg`` decode steps
    speed_tg: float  # generated tokens/s: pl * tg / t_tg
    n_threads: int | None = None  # only in the JSONL output


def default_gguf(model: Path, root: Path = DEFAULT_DIR) -> Path:
    """Where ``tools/build_llamacpp.sh`` writes the f32 conversion of checkpoint folder ``model``."""
    return root / "gguf" / f"{Path(model).resolve().name}-f32.gguf"


def locate(model: Path, binary: str | None = None, gguf: str | None = None,
           env: Mapping[str, str] = os.environ, root: Path = DEFAULT_DIR) -> LlamaCpp | Skipped:
    """The binary (``binary``, else ``$LLAMACPP_BIN``, else the build script's) and the GGUF of ``model``
    (``gguf``, else ``$LLAMACPP_GGUF``, else the build script's), or why the baseline is skipped."""
    bin_path = Path(binary or env.get(BIN_ENV) or root / "llama-batched-bench")
    gguf_path = Path(gguf or env.get(GGUF_ENV) or default_gguf(model, root))
    hint = BUILD_HINT.format(model=model)
    if not bin_path.is_file() or not os.access(bin_path, os.X_OK):
        return Skipped(f"llama.cpp baseline skipped: no llama-batched-bench executable at {bin_path} ({hint}, "
                       f"or point --llamacpp-bin / ${BIN_ENV} at one)")
    if not gguf_path.is_file():
        return Skipped(f"llama.cpp baseline skipped: no GGUF of {model} at {gguf_path} ({hint}, "
                       f"or point --llamacpp-gguf / ${GGUF_ENV} at one)")
    return LlamaCpp(bin_path, gguf_path)


def batched_bench_command(llama: LlamaCpp, *, threads: int, prompt_tokens: int, gen_tokens: int,
                          parallel: Sequence[int]) -> list[str]:
    """The ``llama-batched-bench`` command line: prompts not shared, context for the largest batch, JSONL out."""
    ctx = max(parallel) * (prompt_tokens + gen_tokens)
    return [str(llama.binary), "-m", str(llama.gguf), "-c", str(ctx), "-b", "2048", "-ub", "512",
            "-npp", str(prompt_tokens), "-ntg", str(gen_tokens), "-npl", ",".join(map(str, parallel)),
            "-t", str(threads), "-tb", str(threads), "-ngl", "0", "--output-format", "jsonl"]


_TABLE_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*\d+\s*\|" + r"\s*([\d.]+)\s*\|" * 6 + r"\s*$")


def parse_batched_bench(text: str) -> list[BatchedBenchRow]:
    """Result rows of ``llama-batched-bench`` output (JSONL lines, or the default Markdown table); log lines
    around them are ignored."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            d = json.loads(line)
            rows.append(BatchedBenchRow(d["pp"], d["tg"], d["pl"], d["t_pp"], d["speed_pp"], d["t_tg"], d["speed_tg"],
                                        d.get("n_threads")))
        elif m := _TABLE_ROW.match(line):
            pp, tg, pl = (int(g) for g in m.groups()[:3])
            t_pp, s_pp, t_tg, s_tg = (float(g) for g in m.groups()[3:7])
            rows.append(BatchedBenchRow(pp, tg, pl, t_pp, s_pp, t_tg, s_tg))
    return rows


def run_batched_bench(llama: LlamaCpp, *, threads: int, prompt_tokens: int, gen_tokens: int,
                      parallel: Sequence[int], timeout: float = 900.0) -> dict[int, BatchedBenchRow]:
    """Run it once for every batch size in ``parallel``; rows keyed by batch size. Raises RuntimeError with
    the tail of its output when it fails or prints no row for a requested batch size."""
    cmd = batched_bench_command(llama, threads=threads, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens,
                                parallel=parallel)
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout)
    rows = {r.pl: r for r in parse_batched_bench(proc.stdout + "\n" + proc.stderr)}
    missing = [p for p in parallel if p not in rows]
    if proc.returncode != 0 or missing:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"llama-batched-bench exited {proc.returncode}, no row for batch sizes {missing}: "
                           f"{' '.join(cmd)}\n{tail}")
    return rows


def decode_tok_per_s(waves: Sequence[Sequence[RequestRecord]]) -> float:
    """Decode tokens/s of our engine, comparable to batched-bench's S_TG: per wave (requests sent together),
    the tokens that arrived after every request had its first token, over the time from then to the last
    token; summed over the waves."""
    tokens, seconds = 0, 0.0
    for wave in waves:
        if not wave or any(not r.events for r in wave):
            raise ValueError("waves: every request needs at least one output token")
        t0 = max(r.events[0][0] for r in wave)
        t1 = max(r.events[-1][0] for r in wave)
        tokens += sum(n for r in wave for t, n in r.events if t > t0)
        seconds += t1 - t0
    if seconds <= 0:
        raise ValueError("waves: no decode time (each request needs more than one output token)")
    return tokens / seconds


def plot_comparison(rows: Sequence[dict], path: Path, title: str) -> None:
    """Grouped bars: decode tok/s of ours and llama.cpp per (threads, batch), the ratio written over each pair."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(rows) + 2), 4.2))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["ours_tok_s"] for r in rows], 0.4, label="ours (in-process LLMEngine)")
    ax.bar([x + 0.2 for x in xs], [r["llamacpp_tok_s"] for r in rows], 0.4, label="llama.cpp (llama-batched-bench)")
    for x, r in zip(xs, rows):
        ax.annotate(f"{r['ratio']:.2f}x", (x, max(r["ours_tok_s"], r["llamacpp_tok_s"])), ha="center",
                    textcoords="offset points", xytext=(0, 3), fontsize=8)
    ax.set_xticks(list(xs), [f"{r['threads']} thr, B={r['batch']}" for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("decode tokens/s (log)")
    ax.set_title(f"{title}\n(labels: ours / llama.cpp, same run)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
