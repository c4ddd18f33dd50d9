"""32 concurrent streams through the aio client; metrics on the metrics port."""
from __future__ import annotations

import asyncio

import tritonclient.grpc.aio as aioclient

from tests.e2e.helpers import MODEL, Result, kv_used, metrics, requested_outputs, run, wait_until
from cli.client import build_inputs, parse_result

N_STREAMS = 32
MAX_TOKENS = 16
PROMPTS = [f"def f{i}(x):\n    return x {'+-*/%'[i % 5]} {i}\n\n\ndef" for i in range(N_STREAMS)]


async def one_stream(client, prompt: str, rid: str) -> Result:
    async def requests():
        yield {"model_name": MODEL, "inputs": build_inputs(prompt, MAX_TOKENS, temperature=0.0, stream=True,
                                                           exclude_input_in_output=True),
               "outputs": requested_outputs(), "request_id": rid, "enable_empty_final_response": True}

    res = Result()
    async for result, error in client.stream_infer(inputs_iterator=requests()):
        if error is not None:
            res.error = str(error)
            break
        chunk = parse_result(result)
        res.chunks.append(chunk)
        if chunk.final:
            break
    return res


async def all_streams(url: str) -> list[Result]:
    client = aioclient.InferenceServerClient(url)
    try:
        return await asyncio.wait_for(
            asyncio.gather(*(one_stream(client, p, f"c{i}") for i, p in enumerate(PROMPTS))), timeout=240)
    finally:
        await client.close()


def test_32_concurrent_streams(server):
    results = asyncio.run(all_streams(server.grpc_url))
    assert len(results) == N_STREAMS
    for i, res in enumerate(results):
        assert res.error is None, f"stream {i}: {res.error}"
        assert res.num_final == 1 and res.chunks[-1].final, f"stream {i} did not end with one final response"
        assert res.finish_reason in ("length", "stop"), f"stream {i}: {res.finish_reason!r}"
    # Each stream's text equals the same request served alone (continuous batching changes nothing).
    for i in (0, 7, 31):
        alone = run(server.grpc_url, PROMPTS[i], MAX_TOKENS, temperature=0.0, stream=False,
                    exclude_input_in_output=True)
        assert results[i].text == alone.text, f"stream {i} differs from the same request served alone"
    wait_until(lambda: kv_used(server.metrics_url) == 0, 10, "KV blocks freed after 32 streams")


def test_trt_llm_metrics_are_published(server):
    wait_until(lambda: any(n == "nv_trt_llm_kv_cache_block_metrics" for n, _ in metrics(server.metrics_url)), 10,
               "the KV metrics family")
    m = metrics(server.metrics_url)

    def labels(name: str, key: str) -> dict[str, float]:
        return {dict(ls)[key]: v for (n, ls), v in m.items() if n == name and dict(ls).get("model") == "llm"}

    kv = labels("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type")
    assert set(kv) == {"max", "free", "used", "tokens_per", "reused", "fraction"}
    assert kv["max"] > 0 and kv["tokens_per"] == 16 and kv["used"] + kv["free"] == kv["max"]
    assert kv["fraction"] == kv["used"] / kv["max"]
    req = labels("nv_trt_llm_request_metrics", "request_type")
    assert set(req) == {"active", "max", "scheduled", "context", "waiting"}
    assert req["max"] == 48


def test_engine_loop_seconds_are_published(server):
    """The llm model's loop thread time (backend/engine/loop_clock.py) after serving a request."""
    run(server.grpc_url, PROMPTS[0], MAX_TOKENS, temperature=0.0, stream=False, exclude_input_in_output=True)

    def loop() -> dict[str, float]:
        return {dict(ls)["state"]: v for (n, ls), v in metrics(server.metrics_url).items()
                if n == "triton_llm_engine_loop_seconds_total" and dict(ls).get("model") == "llm"}
    wait_until(lambda: loop().get("busy", 0) > 0 and loop().get("cpu", 0) > 0, 10, "the loop seconds")
    s = loop()
    assert set(s) == {"busy", "cpu", "runqueue", "blocked"}
    assert 0 <= s["blocked"] <= s["busy"] and s["runqueue"] >= 0
