"""Closed-loop load drivers: ``concurrency`` requests in flight, a new one as soon as one finishes.

Two drivers fill one ``bench.harness.stats.RequestRecord`` per request, aligned with the items they get
(``None`` where the level's time ran out before the request was sent), and return the level's
wall time:

- ``run_engine_level``: in-process, through ``LLMEngine.add_request`` (callbacks on the engine
  thread). Items need ``prompt_ids`` and ``params`` (``bench.harness.workload.BenchRequest`` or ``WorkItem``).
- ``run_pipeline_level``: the ensemble over gRPC, one ``stream_infer`` stream per request
  (``tritonclient.grpc.aio``). Items need ``values()``, the ensemble inputs (``WorkItem``).

For a side-by-side comparison, wrap each side as a ``Runner`` (``engine_runner``,
``pipeline_runner`` or your own coroutine) and hand them to ``sweep``: per concurrency level every
side runs every item once, in ``segments`` order, and each level becomes one row of
``bench.harness.stats.summarize`` dicts keyed by side.
"""
from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence

from bench.harness.stats import RequestRecord, summarize
from cli.client import INPUT_TYPES, parse_result, to_array

clock = time.perf_counter
OUTPUTS = ("text_output", "finish_reason", "num_input_tokens", "num_output_tokens")

Records = list[RequestRecord | None]
# runner(items, concurrency, level_seconds) -> (records aligned with items, wall seconds)
Runner = Callable[[Sequence[Any], int, float], Awaitable[tuple[Records, float]]]


# ---- in-process -------------------------------------------------------------------------------------

def run_engine_level(engine, items: Sequence[Any], concurrency: int, *, level_seconds: float,
                     request_timeout: float) -> tuple[Records, float]:
    """Closed loop through ``engine.add_request``; no new request after ``level_seconds``.

    Blocks until every sent request is finished; if none finishes for ``request_timeout`` seconds,
    the unfinished ones are aborted and recorded as errors.
    """
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
            if rec.record(out, clock()):
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


def engine_runner(engine, *, request_timeout: float) -> Runner:
    """``run_engine_level`` as a ``Runner`` (in a worker thread, so the event loop stays free)."""
    async def run(items, concurrency, level_seconds):
        return await asyncio.to_thread(run_engine_level, engine, items, concurrency, level_seconds=level_seconds,
                                       request_timeout=request_timeout)
    return run


# ---- ensemble over gRPC streaming -------------------------------------------------------------------

async def consume(responses: AsyncIterator, record: RequestRecord, parse: Callable = parse_result,
                  now: Callable[[], float] = clock) -> None:
    """Read one request's stream into ``record`` until its final response (or an error).

    Tokens per response come from the cumulative ``num_output_tokens`` (never from the text); the
    request is done at the response flagged final or the one carrying a finish reason (the stream
    may also close after it).
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


async def pipeline_request(client, item, *, model: str, timeout: float) -> RequestRecord:
    """One request on its own stream; gRPC failures and timeouts are recorded, never raised."""
    import tritonclient.grpc.aio as grpcclient

    inputs = []
    for name, value in item.values().items():
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


async def run_pipeline_level(client, items: Sequence[Any], concurrency: int, *, model: str,
                             level_seconds: float, request_timeout: float) -> tuple[Records, float]:
    """Closed loop: ``concurrency`` streams in flight; no new request after ``level_seconds``."""
    records: Records = [None] * len(items)
    order = iter(range(len(items)))
    t0 = clock()

    async def worker():
        for i in order:
            if clock() - t0 > level_seconds:
                return
            records[i] = await pipeline_request(client, items[i], model=model, timeout=request_timeout)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(items)))))
    return records, clock() - t0


def pipeline_runner(client, *, model: str, request_timeout: float) -> Runner:
    """``run_pipeline_level`` against ``model`` (e.g. "ensemble") as a ``Runner``."""
    async def run(items, concurrency, level_seconds):
        return await run_pipeline_level(client, items, concurrency, model=model, level_seconds=level_seconds,
                                        request_timeout=request_timeout)
    return run


# ---- side-by-side levels ----------------------------------------------------------------------------

def segments(n: int, concurrency: int, sides: Sequence[str] = ("pipeline", "engine")) -> list[tuple[str, int, int]]:
    """Run order of one level: (side, first item, end item); each side runs every item once.

    With two sides, when half the level's requests still fill ``concurrency`` slots, the halves run
    A B B A, so a load drift during the level hits both sides alike; otherwise (too few requests to
    split) A then B on all of them.
    """
    if len(sides) != 2:
        return [(side, 0, n) for side in sides]
    a, b = sides
    half = n // 2
    if half >= concurrency and n - half >= concurrency:
        return [(a, 0, half), (b, 0, half), (b, half, n), (a, half, n)]
    return [(a, 0, n), (b, 0, n)]


@dataclass
class LevelRun:
    """What one level's runs left: their order, each side's records (aligned with the items) and seconds."""

    order: list[tuple[str, int, int]]
    records: dict[str, Records]
    seconds: dict[str, float]

    def order_labels(self) -> list[str]:
        return ["{}[{}:{}]".format(*o) for o in self.order]


async def run_level(runners: Mapping[str, Runner], items: Sequence[Any], concurrency: int,
                    level_seconds: float) -> LevelRun:
    """Every side runs every item once in ``segments`` order; a segment gets its share of ``level_seconds``."""
    run = LevelRun(segments(len(items), concurrency, tuple(runners)),
                   {side: [None] * len(items) for side in runners}, {side: 0.0 for side in runners})
    for side, lo, hi in run.order:
        got, dt = await runners[side](items[lo:hi], concurrency, level_seconds * (hi - lo) / len(items))
        run.records[side][lo:hi] = got
        run.seconds[side] += dt
    return run


async def sweep(workloads: Mapping[int, Sequence[Any]], runners: Mapping[str, Runner], *, level_seconds: float,
                deadline: float, annotate: Callable[[dict, LevelRun, Sequence[Any]], None] | None = None,
                show: Callable[[dict], None] | None = None) -> list[dict]:
    """One row per concurrency level (``workloads``: concurrency -> items), until ``deadline`` (a ``clock()`` time).

    A row is ``{"concurrency", "order", <side>: summarize(...) for each runner}``; ``annotate(row,
    run, items)`` may add fields (e.g. how many outputs agree), ``show(row)`` prints it.
    """
    rows: list[dict] = []
    for c, items in workloads.items():
        if clock() > deadline:
            print(f"(--max-seconds reached: skipping concurrency {c} and above)", flush=True)
            break
        run = await run_level(runners, items, c, level_seconds)
        row: dict[str, Any] = {"concurrency": c, "order": run.order_labels()}
        for side in runners:
            row[side] = summarize(run.records[side], run.seconds[side])
        if annotate is not None:
            annotate(row, run, items)
        rows.append(row)
        if show is not None:
            show(row)
    return rows
