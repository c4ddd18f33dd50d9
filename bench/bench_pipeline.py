"""Pipeline benchmark: the Triton ensemble over gRPC streaming vs the in-process engine, same workload, one run.

    .venv/bin/python bench/bench_pipeline.py                     # starts tritonserver itself (free ports)
    .venv/bin/python bench/bench_pipeline.py --model /path/ckpt  # another checkpoint (server and in-process)
    .venv/bin/python bench/bench_pipeline.py --url 127.0.0.1:8001   # an already-running server
    .venv/bin/python bench/bench_pipeline.py --quick             # fewer, shorter requests (smoke run)

A closed-loop load generator (``tritonclient.grpc.aio``, one ``stream_infer`` stream per request,
``concurrency`` requests in flight) sends seeded prompts cut from held-out code to the ``ensemble``
with TensorRT-LLM's input names: ``text_input``, ``max_tokens``, ``stream=true``, ``temperature=0``,
``exclude_input_in_output=true``, ``min_tokens=max_tokens`` (the API's ignore-EOS equivalent: EOS is
banned until ``max_tokens`` are out, so every request produces exactly ``max_tokens``) and
``return_num_output_tokens=true`` (tokens are counted from it, never from the text).

The same requests then run through ``LLMEngine`` in this process, built with the same EngineConfig as
the server's ``llm`` model (``model_repository/llm/config.pbtxt`` plus the same overrides). Prompt ids
and SamplingParams come from running preprocess's own ``RequestParser`` on the same inputs, so both
sides see token-identical prompts. The two sides alternate within each level (halves in the order
pipeline, in-process, in-process, pipeline where half the requests still fill the concurrency), so a
drifting background load hits both alike.

Per request: TTFT, inter-token latency (gap between streamed responses / tokens in the later one),
TPOT ((last token - first token) / (tokens - 1)), end-to-end latency. Per level: output tokens/s,
p50/p90/p99. Ratios: pipeline TPOT p50 at concurrency 1 / in-process (goal <= 1.15) and pipeline
tokens/s at 32 concurrent / in-process (goal >= 0.85). Writes bench/results/pipeline.json and
bench/results/pipeline.png. Bounded: each level takes no new requests after --level-seconds, each
request is cut at --request-timeout, the sweep skips remaining levels after --max-seconds; a server
started here is always stopped (also on Ctrl-C / SIGTERM).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.client import INPUT_TYPES, parse_result, to_array  # noqa: E402
from tools.triton_launcher import (  # noqa: E402
    CACHE,
    MODEL_REPOSITORY,
    LauncherError,
    Ports,
    TritonServer,
    render_model_repository,
    set_parameters,
)

LEVELS = (1, 4, 8, 16, 32)
GOAL_TPOT_RATIO = 1.15      # pipeline TPOT at concurrency 1 / in-process, at most
GOAL_THROUGHPUT_RATIO = 0.85  # pipeline tokens/s at 32 concurrent / in-process, at least
OUTPUTS = ("text_output", "finish_reason", "num_input_tokens", "num_output_tokens")
clock = time.perf_counter


# ---- workload ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkItem:
    """One request: the text sent to the ensemble and what preprocess makes of it."""

    text: str
    max_tokens: int
    prompt_ids: tuple[int, ...] = ()
    params: Any = None          # backend.sampling_params.SamplingParams, from preprocess's parser


def request_values(text: str, max_tokens: int) -> dict[str, Any]:
    """The ensemble inputs of one benchmark request (TensorRT-LLM names)."""
    return {"text_input": text, "max_tokens": max_tokens, "stream": True, "temperature": 0.0,
            "min_tokens": max_tokens, "exclude_input_in_output": True, "return_num_output_tokens": True,
            "return_num_input_tokens": True}


def make_workload(model: Path, n: int, seed: int, prompt_range=(32, 256), output_range=(32, 128)) -> list[WorkItem]:
    """``n`` seeded requests: prompts cut from held-out code as text, parsed by preprocess's RequestParser."""
    import random

    raw, parser, ids = _workload_tools(str(model))
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        plen = rng.randint(*prompt_range)
        start = rng.randrange(0, len(ids) - plen)
        text = raw.decode(ids[start:start + plen - 1])
        max_tokens = rng.randint(*output_range)
        pre = parser.parse({k: to_array(k, v) for k, v in request_values(text, max_tokens).items()})
        items.append(WorkItem(text, max_tokens, tuple(pre.prompt_token_ids), pre.sampling_params))
    return items


@functools.lru_cache(maxsize=4)
def _workload_tools(model: str):
    """(raw tokenizer, preprocess's RequestParser, held-out corpus ids) for a checkpoint folder."""
    from tokenizers import Tokenizer as RawTokenizer

    from bench.workload import corpus_ids
    from preprocess import RequestLimits, RequestParser, load_tokenizer
    from preprocess.serving import model_context_length

    raw = RawTokenizer.from_file(str(Path(model) / "tokenizer.json"))
    ctx = model_context_length(Path(model))
    parser = RequestParser(load_tokenizer(model), RequestLimits(max_model_len=ctx) if ctx else None)
    return raw, parser, corpus_ids(raw, 8192)


def requests_for(concurrency: int, lo: int, hi: int) -> int:
    """Requests at one level: twice the concurrency, within [lo, hi]."""
    return max(lo, min(hi, 2 * concurrency))


# ---- per-request records and statistics -----------------------------------------------------------

@dataclass
class RequestRecord:
    start: float
    events: list[tuple[float, int]] = field(default_factory=list)  # (arrival time, new output tokens)
    end: float | None = None
    finish_reason: str = ""
    num_input_tokens: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    error: str | None = None
    stream_cancelled: bool = False  # the stream did not close by itself after the final response

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.events)


def percentile(xs: Sequence[float], q: float) -> float:
    """``q``-th percentile (0..100) with linear interpolation between closest ranks (numpy's default)."""
    if not xs:
        return math.nan
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def dist_ms(xs: Sequence[float]) -> dict[str, float | None]:
    """mean/p50/p90/p99 of seconds, in milliseconds (None when there is no sample)."""
    out = {"n": len(xs), "mean": 1e3 * sum(xs) / len(xs) if xs else math.nan}
    for q in (50, 90, 99):
        out[f"p{q}"] = 1e3 * percentile(xs, q)
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


def request_metrics(r: RequestRecord) -> dict[str, Any]:
    """TTFT, inter-token latencies, TPOT and end-to-end latency (seconds) of one finished request."""
    if not r.events:
        return {"ttft": None, "itl": [], "tpot": None, "e2e": None}
    first = r.events[0][0]
    itl: list[float] = []
    for (t0, _), (t1, n) in zip(r.events, r.events[1:]):
        itl.extend([(t1 - t0) / n] * n)
    tokens = r.tokens
    last = r.events[-1][0]
    return {"ttft": first - r.start, "itl": itl,
            "tpot": (last - first) / (tokens - 1) if tokens > 1 else None,
            "e2e": (r.end if r.end is not None else last) - r.start}


def summarize(records: Sequence[RequestRecord], seconds: float) -> dict[str, Any]:
    """Level statistics: throughput over the level's wall time, latency distributions over completed requests."""
    done = [r for r in records if r.error is None and r.events]
    ms = [request_metrics(r) for r in done]
    tokens = sum(r.tokens for r in records)
    return {
        "requests": len(records), "completed": len(done), "errors": sum(r.error is not None for r in records),
        "output_tokens": tokens, "seconds": seconds,
        "tok_per_s": tokens / seconds if seconds > 0 else None,
        "req_per_s": len(done) / seconds if seconds > 0 else None,
        "ttft_ms": dist_ms([m["ttft"] for m in ms]),
        "itl_ms": dist_ms([x for m in ms for x in m["itl"]]),
        "tpot_ms": dist_ms([m["tpot"] for m in ms if m["tpot"] is not None]),
        "e2e_ms": dist_ms([m["e2e"] for m in ms]),
        "first_error": next((r.error for r in records if r.error), None),
        "streams_cancelled": sum(r.stream_cancelled for r in records),
    }


# ---- pipeline side (gRPC streaming) ---------------------------------------------------------------

async def consume(responses: AsyncIterator, record: RequestRecord, parse: Callable = parse_result,
                  now: Callable[[], float] = clock) -> None:
    """Read one request's stream into ``record`` until its final response (or an error).

    Tokens per response come from the cumulative ``num_output_tokens``; the request is done at the
    response flagged final or the one carrying a finish reason (the stream may also close after it).
    """
    seen = 0
    async for result, error in responses:
        t = now()
        if error is not None:
            record.error = str(getattr(error, "message", lambda: error)())
            record.end = t
            return
        chunk = parse(result)
        if chunk.num_output_tokens > seen:
            record.events.append((t, chunk.num_output_tokens - seen))
            seen = chunk.num_output_tokens
        record.text += chunk.text
        record.num_input_tokens = chunk.num_input_tokens or record.num_input_tokens
        record.finish_reason = chunk.finish_reason or record.finish_reason
        if chunk.final or chunk.finish_reason:
            record.end = t
            return
    record.end = now()
    if not record.finish_reason:
        record.error = "stream closed before a final response"


async def pipeline_request(client, item: WorkItem, *, model: str, timeout: float) -> RequestRecord:
    import tritonclient.grpc.aio as grpcclient

    inputs = []
    for name, value in request_values(item.text, item.max_tokens).items():
        arr = to_array(name, value)
        inp = grpcclient.InferInput(name, list(arr.shape), INPUT_TYPES[name])
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    outputs = [grpcclient.InferRequestedOutput(o) for o in OUTPUTS]
    done = asyncio.Event()

    async def requests():
        yield {"model_name": model, "inputs": inputs, "outputs": outputs, "request_id": uuid.uuid4().hex}
        await done.wait()  # keep our side open until the request is over; then the server closes the stream

    record = RequestRecord(start=clock())
    responses = client.stream_infer(requests(), stream_timeout=timeout)
    try:
        await asyncio.wait_for(consume(responses, record), timeout)
    except asyncio.TimeoutError:
        record.error = f"no final response within {timeout:.0f}s"
    except Exception as e:  # gRPC failure: recorded, the level goes on
        details = e.details() if callable(getattr(e, "details", None)) else str(e)
        code = e.code().name if callable(getattr(e, "code", None)) else type(e).__name__
        record.error = f"{code}: {details}"
    finally:
        done.set()
    try:  # let the server close the stream cleanly (it does after its own final response)
        async def drain():
            async for _ in responses:
                pass
        await asyncio.wait_for(drain(), 5.0)
    except Exception:
        record.stream_cancelled = True
        responses.cancel()
    if record.end is None:
        record.end = clock()
    return record


async def run_pipeline_level(client, items: Sequence[WorkItem], concurrency: int, *, model: str,
                             level_seconds: float, request_timeout: float) -> tuple[list[RequestRecord | None], float]:
    """Closed loop: ``concurrency`` streams in flight; no new request after ``level_seconds``.

    Records are aligned with ``items`` (None where the level's time ran out first).
    """
    records: list[RequestRecord | None] = [None] * len(items)
    order = iter(range(len(items)))
    t0 = clock()

    async def worker():
        for i in order:
            if clock() - t0 > level_seconds:
                return
            records[i] = await pipeline_request(client, items[i], model=model, timeout=request_timeout)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(items)))))
    return records, clock() - t0


# ---- in-process side --------------------------------------------------------------------------------

def run_engine_level(engine, items: Sequence[WorkItem], concurrency: int, *, level_seconds: float,
                     request_timeout: float) -> tuple[list[RequestRecord | None], float]:
    """The same closed loop through ``LLMEngine.add_request`` (callbacks on the engine thread)."""
    lock = threading.Lock()
    finished = threading.Semaphore(0)
    records: dict[int, RequestRecord] = {}
    state = {"next": 0, "submitted": 0}
    t0 = clock()
    tag = uuid.uuid4().hex[:8]

    def submit_next() -> bool:
        with lock:
            i = state["next"]
            if i >= len(items) or clock() - t0 > level_seconds:
                return False
            state["next"] += 1
            state["submitted"] += 1
            records[i] = rec = RequestRecord(start=clock())
        engine.add_request(f"bench-{tag}-{i}", items[i].prompt_ids, items[i].params, on_output(rec))
        return True

    def on_output(rec: RequestRecord):
        def cb(out):
            t = clock()
            if out.new_token_ids:
                rec.events.append((t, len(out.new_token_ids)))
                rec.token_ids.extend(out.new_token_ids)
            if out.request_finished:
                rec.end = t
                rec.finish_reason = str(getattr(out.finish_reason, "value", out.finish_reason) or "")
                if getattr(out, "error", None):
                    rec.error = str(out.error)
                submit_next()
                finished.release()
        return cb

    for _ in range(min(concurrency, len(items))):
        submit_next()
    completed = 0
    while True:
        with lock:
            if completed >= state["submitted"]:
                break
        if not finished.acquire(timeout=request_timeout):
            for i, rec in records.items():
                if rec.end is None:
                    rec.error = f"no final output within {request_timeout:.0f}s"
                    engine.abort(f"bench-{tag}-{i}")
            break
        completed += 1
    return [records.get(i) for i in range(len(items))], clock() - t0


def segments(n: int, concurrency: int, with_engine: bool = True) -> list[tuple[str, int, int]]:
    """Run order of one level: (side, first item, end item).

    When half the level's requests still fill ``concurrency`` slots, the halves run A B B A
    (pipeline, in-process, in-process, pipeline), so a load drift during the level hits both sides
    alike; otherwise (too few requests to split) pipeline then in-process on all of them.
    """
    if not with_engine:
        return [("pipeline", 0, n)]
    half = n // 2
    if half >= concurrency and n - half >= concurrency:
        return [("pipeline", 0, half), ("engine", 0, half), ("engine", half, n), ("pipeline", half, n)]
    return [("pipeline", 0, n), ("engine", 0, n)]


# ---- configuration shared by the server and the in-process engine ----------------------------------

_PARAM = re.compile(r'parameters\s*[:]?\s*\{\s*key:\s*"([^"]+)"\s*,?\s*value:\s*\{\s*string_value:\s*"((?:[^"\\]|\\.)*)"')


def pbtxt_parameters(text: str) -> dict[str, str]:
    """``parameters { key: ... value: { string_value: ... } }`` of a config.pbtxt as a dict."""
    return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _PARAM.findall(text)}


def parse_overrides(items: Sequence[str]) -> dict[str, dict[str, str]]:
    from tools.serve import parse_overrides as parse
    return parse(list(items))


def repository_overrides(model: Path | None, sets: Sequence[str]) -> dict[str, dict[str, str]]:
    """``--model`` points every model of the ensemble at one checkpoint; ``--set`` adds any parameter."""
    out: dict[str, dict[str, str]] = {}
    if model is not None:
        out = {"llm": {"model_path": str(model)}, "preprocess": {"tokenizer_path": str(model)},
               "postprocess": {"tokenizer_path": str(model)}}
    for m, params in parse_overrides(sets).items():
        out.setdefault(m, {}).update(params)
    return out


def engine_config(overrides: dict[str, dict[str, str]]):
    """The EngineConfig the ``llm`` model builds from its config.pbtxt (with the same overrides)."""
    from backend.config import EngineConfig
    from backend.serving.llm_serving import resolve_paths, split_parameters

    text = set_parameters((MODEL_REPOSITORY / "llm" / "config.pbtxt").read_text(), overrides.get("llm", {}))
    engine_params, _ = split_parameters(resolve_paths(pbtxt_parameters(text)))
    return EngineConfig.from_parameters(engine_params), engine_params


# ---- report ---------------------------------------------------------------------------------------

def ratios(levels: list[dict]) -> dict[str, Any]:
    by = {row["concurrency"]: row for row in levels if row.get("engine")}
    out: dict[str, Any] = {}
    if not by:
        return out
    lo, hi = min(by), max(by)
    p_tpot, e_tpot = by[lo]["pipeline"]["tpot_ms"]["p50"], by[lo]["engine"]["tpot_ms"]["p50"]
    if p_tpot and e_tpot:
        out["tpot_ratio"] = {"concurrency": lo, "pipeline_ms": p_tpot, "engine_ms": e_tpot,
                             "ratio": p_tpot / e_tpot, "goal_max": GOAL_TPOT_RATIO,
                             "meets_goal": p_tpot / e_tpot <= GOAL_TPOT_RATIO}
    p_tps, e_tps = by[hi]["pipeline"]["tok_per_s"], by[hi]["engine"]["tok_per_s"]
    if p_tps and e_tps:
        out["throughput_ratio"] = {"concurrency": hi, "pipeline_tok_s": p_tps, "engine_tok_s": e_tps,
                                   "ratio": p_tps / e_tps, "goal_min": GOAL_THROUGHPUT_RATIO,
                                   "meets_goal": p_tps / e_tps >= GOAL_THROUGHPUT_RATIO}
    return out


def _f(x, spec=".1f") -> str:
    return "-" if x is None else format(x, spec)


def print_level(row: dict) -> None:
    p, e = row["pipeline"], row.get("engine")
    ratio = p["tok_per_s"] / e["tok_per_s"] if e and e.get("tok_per_s") and p.get("tok_per_s") else None
    d = lambda s, k: "/".join(_f(s[k][q]) for q in ("p50", "p90", "p99"))  # noqa: E731
    print(f"{row['concurrency']:>4} {p['completed']:>3}/{p['requests']:<3} {_f(p['tok_per_s'], '.0f'):>9} "
          f"{_f(e and e['tok_per_s'], '.0f'):>9} {_f(ratio, '.2f'):>5} {d(p, 'ttft_ms'):>20} {d(p, 'itl_ms'):>17} "
          f"{_f(p['tpot_ms']['p50'], '.2f'):>7}/{_f(e and e['tpot_ms']['p50'], '.2f'):<7} {d(p, 'e2e_ms'):>22}",
          flush=True)
    if p["errors"]:
        print(f"     pipeline errors: {p['errors']} (first: {p['first_error']})", flush=True)
    if e and e["errors"]:
        print(f"     in-process errors: {e['errors']} (first: {e['first_error']})", flush=True)


HEADER = (f"{'conc':>4} {'done':>7} {'pipe tok/s':>9} {'eng tok/s':>9} {'ratio':>5} {'TTFT p50/90/99 ms':>20} "
          f"{'ITL p50/90/99 ms':>17} {'TPOT p50 pipe/eng':>15} {'E2E p50/90/99 ms':>22}")


def plot(levels: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for side, style in (("pipeline", "o-"), ("engine", "s--")):
        rows = [r for r in levels if r.get(side) and r[side].get("tok_per_s")]
        if not rows:
            continue
        label = "Triton ensemble (gRPC stream)" if side == "pipeline" else "in-process LLMEngine"
        x = [r[side]["tok_per_s"] for r in rows]
        for ax, key in zip(axes, ("tpot_ms", "ttft_ms")):
            y = [r[side][key]["p50"] for r in rows]
            ax.plot(x, y, style, label=label)
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
    fig.suptitle("Latency vs throughput: same workload, pipeline vs in-process")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except Exception:
        return None


# ---- main -------------------------------------------------------------------------------------------

class _Terminated(Exception):
    pass


class ServerDied(LauncherError):
    """The tritonserver started by this run exited during the sweep."""


def _on_sigterm(*_):
    raise _Terminated()


async def sweep(args, url: str, cfg, workloads: dict[int, list[WorkItem]], deadline: float,
                server: TritonServer | None = None) -> list[dict]:
    import tritonclient.grpc.aio as grpcclient

    from backend.engine.llm_engine import LLMEngine

    engine = None if args.skip_engine else LLMEngine(cfg).start()
    client = grpcclient.InferenceServerClient(url)
    levels: list[dict] = []
    try:
        if not await client.is_model_ready(args.triton_model):
            raise LauncherError(f"model {args.triton_model!r} is not ready at {url}")
        # Warm-up (not measured): one short request per side, a prompt outside the workload.
        warm = [WorkItem(w.text, 8, w.prompt_ids, dataclasses.replace(w.params, max_tokens=8, min_tokens=8))
                for w in make_workload(Path(cfg.model_path), 1, args.seed - 1, args.prompt_range, args.output_range)]
        await run_pipeline_level(client, warm, 1, model=args.triton_model, level_seconds=60,
                                 request_timeout=args.request_timeout)
        if engine is not None:
            await asyncio.to_thread(run_engine_level, engine, warm, 1, level_seconds=60,
                                    request_timeout=args.request_timeout)
        print(HEADER, flush=True)
        for c in args.levels:
            if clock() > deadline:
                print(f"(--max-seconds reached: skipping concurrency {c} and above)", flush=True)
                break
            items = workloads[c]
            recs: dict[str, list[RequestRecord | None]] = {"pipeline": [None] * len(items),
                                                           "engine": [None] * len(items)}
            secs = {"pipeline": 0.0, "engine": 0.0}
            order = segments(len(items), c, engine is not None)
            for side, lo, hi in order:
                kw = dict(level_seconds=args.level_seconds * (hi - lo) / len(items),
                          request_timeout=args.request_timeout)
                if side == "pipeline":
                    got, dt = await run_pipeline_level(client, items[lo:hi], c, model=args.triton_model, **kw)
                    if server is not None and server.proc is not None and server.proc.poll() is not None:
                        raise ServerDied(f"tritonserver exited with code {server.proc.returncode} during "
                                         f"concurrency {c}")
                else:
                    got, dt = await asyncio.to_thread(run_engine_level, engine, items[lo:hi], c, **kw)
                recs[side][lo:hi] = got
                secs[side] += dt
            prec = [r for r in recs["pipeline"] if r is not None]
            row: dict[str, Any] = {"concurrency": c, "order": ["{}[{}:{}]".format(*o) for o in order],
                                   "pipeline": summarize(prec, secs["pipeline"])}
            row["pipeline"]["num_input_tokens_match"] = sum(
                r is not None and r.num_input_tokens == len(it.prompt_ids) for r, it in zip(recs["pipeline"], items))
            if engine is not None:
                row["engine"] = summarize([r for r in recs["engine"] if r is not None], secs["engine"])
                # Greedy on both sides: same prompt ids -> normally the same text (batching may flip near-ties).
                tok = _detok(cfg.model_path)
                row["identical_outputs"] = sum(
                    1 for p, e in zip(recs["pipeline"], recs["engine"])
                    if p and e and p.error is None and e.error is None and p.text == tok.decode(e.token_ids))
            levels.append(row)
            print_level(row)
    finally:
        await client.close()
        if engine is not None:
            engine.shutdown()
    return levels


_TOK: dict[str, Any] = {}


def _detok(model_path: str):
    if model_path not in _TOK:
        from preprocess import load_tokenizer
        _TOK[model_path] = load_tokenizer(model_path)
    return _TOK[model_path]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="checkpoint folder for server and in-process engine "
                    "(default: model_path of model_repository/llm/config.pbtxt)")
    ap.add_argument("--url", help="gRPC endpoint of a running server (e.g. 127.0.0.1:8001); default: start one")
    ap.add_argument("--set", action="append", default=[], metavar="MODEL.KEY=VALUE",
                    help="config.pbtxt parameter override for the started server and the in-process engine")
    ap.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrency levels (default 1,4,8,16,32)")
    ap.add_argument("--min-requests", type=int, default=8, help="requests per level, at least (default 8)")
    ap.add_argument("--max-requests", type=int, default=48, help="requests per level, at most (default 48)")
    ap.add_argument("--prompt-tokens", default="32,256", help="prompt length range in tokens (default 32,256)")
    ap.add_argument("--output-tokens", default="32,128", help="max_tokens range (default 32,128)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="smoke run: 4..16 requests per level, short outputs")
    ap.add_argument("--skip-engine", action="store_true", help="pipeline only (no in-process comparison)")
    ap.add_argument("--level-seconds", type=float, default=90.0, help="no new requests after this (per level)")
    ap.add_argument("--request-timeout", type=float, default=120.0)
    ap.add_argument("--max-seconds", type=float, default=900.0, help="skip remaining levels after this")
    ap.add_argument("--server-timeout", type=float, default=300.0, help="seconds to wait for the server to be ready")
    ap.add_argument("--triton-model", default="ensemble")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--note", default="", help="free text stored in the JSON (e.g. the machine's conditions)")
    args = ap.parse_args(argv)
    args.levels = [int(x) for x in args.levels.split(",") if x.strip()]
    if not args.levels or min(args.levels) < 1:
        ap.error("--levels: positive integers")
    prompt_range = tuple(int(x) for x in args.prompt_tokens.split(","))
    output_range = tuple(int(x) for x in args.output_tokens.split(","))
    if args.quick:
        args.min_requests, args.max_requests = 4, 16
        output_range = (16, 48)
    args.prompt_range, args.output_range = prompt_range, output_range

    try:
        overrides = repository_overrides(args.model.resolve() if args.model else None, args.set)
        cfg, engine_params = engine_config(overrides)
    except (LauncherError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model = Path(cfg.model_path)
    if not (model / "config.json").is_file() or not any(model.glob("*.safetensors")):
        print(f"error: {model} has no checkpoint (config.json + *.safetensors); train the demo model "
              "(tools/train_demo.sh) or pass --model", file=sys.stderr)
        return 2

    print(f"model: {model}\nworkload: prompts {prompt_range} tokens, max_tokens {output_range}, seed {args.seed}",
          flush=True)
    workloads = {c: make_workload(model, requests_for(c, args.min_requests, args.max_requests), args.seed + c,
                                  prompt_range, output_range) for c in args.levels}
    start_wall = clock()
    deadline = start_wall + args.max_seconds
    load_before = os.getloadavg()

    server = tmpdir = None
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        url = args.url
        if url is None:
            CACHE.mkdir(parents=True, exist_ok=True)
            tmpdir = Path(tempfile.mkdtemp(prefix="bench_pipeline.", dir=CACHE))
            repo = render_model_repository(tmpdir / "model_repository", overrides)
            ports = Ports.free()
            server = TritonServer(repo, ports, log_path=tmpdir / "server.log", extra_args=[
                "--exit-timeout-secs=10", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
                "--metrics-address=127.0.0.1"])
            print(f"starting tritonserver (gRPC 127.0.0.1:{ports.grpc}, log {tmpdir / 'server.log'}) ...", flush=True)
            server.start()
            server.wait_ready(timeout=args.server_timeout)
            url = f"127.0.0.1:{ports.grpc}"
        print(f"pipeline: {url} model '{args.triton_model}'; in-process: LLMEngine with the llm config "
              f"({', '.join(f'{k}={v}' for k, v in sorted(engine_params.items()) if k != 'model_path')})", flush=True)
        levels = asyncio.run(sweep(args, url, cfg, workloads, deadline, server))
    except (LauncherError, _Terminated, KeyboardInterrupt) as e:
        print(f"\nstopped: {type(e).__name__}: {e}", file=sys.stderr)
        if server is not None:
            print("--- server log tail ---\n" + server.log_tail(25), file=sys.stderr)
        return 1
    finally:
        if server is not None:
            code = server.stop(timeout=30)
            print(f"tritonserver stopped (exit code {code})", flush=True)
        if tmpdir is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            if (tmpdir / "server.log").is_file():
                shutil.copy(tmpdir / "server.log", args.out / "pipeline_server.log")
                print(f"server log: {args.out / 'pipeline_server.log'}", flush=True)
            shutil.rmtree(tmpdir, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)

    result = {
        "levels": levels, "ratios": ratios(levels),
        "workload": {"seed": args.seed, "prompt_tokens": prompt_range, "output_tokens": output_range,
                     "requests_per_level": {c: len(workloads[c]) for c in args.levels},
                     "options": {k: v for k, v in request_values("", 0).items() if k != "text_input"} |
                     {"max_tokens": "per request", "min_tokens": "= max_tokens"}},
        "engine_config": engine_params, "url": args.url or "started by this run",
        "machine": {"cpu_count": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                    "torch_threads": _torch_threads(), "sched_autogroup": _read("/proc/sys/kernel/sched_autogroup_enabled"),
                    "note": args.note},
        "commit": git_commit(), "seconds": clock() - start_wall,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    r = result["ratios"]
    if "tpot_ratio" in r:
        t = r["tpot_ratio"]
        print(f"TPOT at concurrency {t['concurrency']}: pipeline {t['pipeline_ms']:.2f} ms / in-process "
              f"{t['engine_ms']:.2f} ms = {t['ratio']:.3f} (goal <= {GOAL_TPOT_RATIO}: "
              f"{'met' if t['meets_goal'] else 'NOT met'})")
    if "throughput_ratio" in r:
        t = r["throughput_ratio"]
        print(f"throughput at concurrency {t['concurrency']}: pipeline {t['pipeline_tok_s']:.0f} tok/s / in-process "
              f"{t['engine_tok_s']:.0f} tok/s = {t['ratio']:.3f} (goal >= {GOAL_THROUGHPUT_RATIO}: "
              f"{'met' if t['meets_goal'] else 'NOT met'})")
    print(f"load average before {load_before[0]:.1f}, after {result['machine']['loadavg_after'][0]:.1f} "
          f"({os.cpu_count()} CPUs); total {result['seconds']:.0f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pipeline.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(levels, args.out / "pipeline.png")
    print(f"wrote {args.out / 'pipeline.json'} and {args.out / 'pipeline.png'}")
    return 0 if levels else 1


if __name__ == "__main__":
    sys.exit(main())
