"""One streamed request through the OpenAI-compatible API, recorded like the gRPC sides' requests.

``openai_request(http, base_url, model, item)`` posts ``/v1/completions`` with ``stream: true`` and
``stream_options.include_usage`` (greedy, ``min_tokens = max_tokens``, as the other sides) over an
``httpx.AsyncClient`` and parses the SSE lines itself, so the client's own cost stays as small as
grpcio's. Chunks carry text, not token counts: each text chunk is one event of one token and the last
is given the rest of ``usage.completion_tokens``, so TPOT ((last - first) / (tokens - 1)) is exact.
"""
from __future__ import annotations

import json
import time

from bench.harness.stats import RequestRecord
from bench.harness.workload import WorkItem

clock = time.perf_counter


async def openai_request(http, base_url: str, model: str, item: WorkItem, *, timeout: float) -> RequestRecord:
    body = {"model": model, "prompt": item.text, "max_tokens": item.max_tokens, "min_tokens": item.max_tokens,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    record = RequestRecord(start=clock())
    usage = None
    try:
        async with http.stream("POST", base_url + "/v1/completions", json=body, timeout=timeout) as r:
            if r.status_code != 200:
                record.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return record
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                t = clock()
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    record.error = chunk["error"].get("message", "error event")
                    break
                for choice in chunk.get("choices") or ():
                    if choice.get("text"):
                        record.events.append((t, 1))
                        record.text += choice["text"]
                    if choice.get("finish_reason"):
                        record.finish_reason = choice["finish_reason"]
                if chunk.get("usage"):
                    usage = chunk["usage"]
                    record.end = t
    except Exception as e:       # httpx's transport errors and timeouts: the request failed
        record.error = f"{type(e).__name__}: {e}"
    if usage is not None and record.events:
        record.num_input_tokens = usage["prompt_tokens"]
        t_last, _ = record.events[-1]
        record.events[-1] = (t_last, usage["completion_tokens"] - (len(record.events) - 1))
    if record.end is None:
        record.end = clock()
        record.error = record.error or "stream ended without usage"
    return record
