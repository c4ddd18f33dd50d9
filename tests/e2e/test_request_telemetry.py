"""Latency histograms, token counters and the per-request log line, on the (untraced) session server."""
from __future__ import annotations

import json
import time

from backend.serving.request_log import token_sha256
from tests.e2e.helpers import Stream, gauge, kv_used, metrics, wait_until
from cli.client import build_inputs

HISTOGRAMS = ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds",
              "request_queue_time_seconds", "request_prompt_tokens", "request_generation_tokens")
PROMPTS = ["def add(a, b):", "import json\n\n", "class Point:\n", "for i in range(10):", "# sort a list\n",
           "x = [1, 2, 3]\n"]


def series(url: str) -> dict[str, float]:
    """The llm model's triton_llm_* series: name (+ finish_reason) -> value (buckets left out)."""
    out = {}
    for (name, labels), v in metrics(url).items():
        d = dict(labels)
        if name.startswith("triton_llm_") and d.get("model") == "llm" and "le" not in d:
            out[name + (f"/{d['finish_reason']}" if "finish_reason" in d else "")] = v
    return out


def idle(url: str) -> bool:
    return kv_used(url) == 0 and gauge(url, "nv_trt_llm_request_metrics", request_type="active") == 0


def test_each_histogram_counts_every_finished_request_once(server):
    url = server.metrics_url
    wait_until(lambda: idle(url), 30, "no request in flight before the snapshot")
    time.sleep(0.5)                          # the telemetry thread records what just finished
    before = series(url)
    results = []
    with Stream(server.grpc_url) as s:      # concurrently, on one stream
        rids = [s.send(build_inputs(p, 8 + i, temperature=0.0, min_tokens=2, stream=True,
                                    exclude_input_in_output=True)) for i, p in enumerate(PROMPTS)]
        results = list(s.wait(rids, 120).values())
    assert all(r.error is None and r.num_final == 1 for r in results)
    n = len(PROMPTS)
    out_tokens = sum(r.num_output_tokens for r in results)
    in_tokens = sum(r.chunks[0].num_input_tokens for r in results)
    itl = "triton_llm_inter_token_latency_seconds_count"
    wait_until(lambda: series(url)["triton_llm_e2e_request_latency_seconds_count"] ==
               before["triton_llm_e2e_request_latency_seconds_count"] + n, 20, "the requests' histograms")
    # the inter-token latency: one observation per decode step (backend/serving/decode_gaps.py); the
    # requests ran concurrently, so at least each request's share and at most one per gap
    wait_until(lambda: series(url).get(itl, 0) >= before.get(itl, 0) + 1, 20, "the inter-token gaps")
    time.sleep(1.0)                          # nothing else arrives: exactly n, not at least n
    after = series(url)
    for h in HISTOGRAMS:
        assert after[f"triton_llm_{h}_count"] - before[f"triton_llm_{h}_count"] == n, h
        assert after[f"triton_llm_{h}_sum"] >= before[f"triton_llm_{h}_sum"], h
    assert 1 <= after[itl] - before.get(itl, 0) <= out_tokens - n     # one per decode step, not per token
    buckets = {dict(labels)["le"]: v for (name, labels), v in metrics(url).items()
               if name == "triton_llm_inter_token_latency_seconds_bucket" and dict(labels).get("model") == "llm"}
    cumulative = [buckets[le] for le in sorted(buckets, key=float)]
    assert buckets["+Inf"] == after[itl] and cumulative == sorted(cumulative) and len(cumulative) == 20
    assert after["triton_llm_generation_tokens_total"] - before["triton_llm_generation_tokens_total"] == out_tokens
    assert after["triton_llm_prompt_tokens_total"] - before["triton_llm_prompt_tokens_total"] == in_tokens
    assert after["triton_llm_request_generation_tokens_sum"] - \
        before["triton_llm_request_generation_tokens_sum"] == out_tokens
    finished = sum(after.get(f"triton_llm_request_success_total/{r}", 0) - before.get(f"triton_llm_request_success_total/{r}", 0)
                   for r in ("stop", "length", "abort", "error"))
    assert finished == n
    # the TensorRT-LLM gauges are still there
    assert gauge(url, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="max") > 0


def log_lines(server, request_id: str, timeout: float = 10.0) -> list[dict]:
    found: list[dict] = []

    def scan() -> bool:
        found.clear()
        for line in server.server.log_path.read_text(errors="replace").splitlines():
            if line.startswith('{"event":"request_finished"'):
                d = json.loads(line)
                if d["request_id"] == request_id:
                    found.append(d)
        return bool(found)
    wait_until(scan, timeout, f"the log line of {request_id}")
    return found


def replay_inputs(line: dict, prompt: str) -> dict:
    """Client inputs that replay a logged request: the same prompt and the whole sampling tuple."""
    s, o = line["sampling"], line["output_options"]
    return dict(temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"], min_p=s["min_p"],
                repetition_penalty=s["repetition_penalty"], presence_penalty=s["presence_penalty"],
                frequency_penalty=s["frequency_penalty"], seed=s["seed"], min_tokens=s["min_tokens"],
                num_return_sequences=s["n"], stop_words=o.get("stop") or None,
                exclude_input_in_output=o["exclude_input_in_output"], skip_special_tokens=o["skip_special_tokens"])


def test_log_line_replays_an_unseeded_sampled_request(server, tokenizer):
    prompt = "def parse(line):\n    "
    options = dict(temperature=1.0, top_k=50, top_p=0.95, repetition_penalty=1.1, exclude_input_in_output=True,
                   stop_words=["\n\n\n"])
    with Stream(server.grpc_url) as s:
        rid = s.send(build_inputs(prompt, 32, **options), request_id="replay-original")
        original = s.wait([rid], 60)[rid]
    line, = log_lines(server, "replay-original")
    assert line["seed_drawn"] and isinstance(line["sampling"]["seed"], int)
    assert line["prompt_sha256"] == token_sha256(tokenizer.encode(prompt))
    assert line["output_tokens"] >= original.num_output_tokens and line["finish_reason"] in ("length", "stop")
    assert line["sampling"]["temperature"] == 1.0 and line["sampling"]["top_p"] == 0.95
    assert line["ttft_s"] > 0 and line["e2e_s"] >= line["ttft_s"]

    with Stream(server.grpc_url) as s:
        rid = s.send(build_inputs(prompt, line["sampling"]["max_tokens"], **replay_inputs(line, prompt)),
                     request_id="replay-again")
        replay = s.wait([rid], 60)[rid]
    assert replay.error is None
    assert replay.text == original.text
    again, = log_lines(server, "replay-again")
    assert again["output_sha256"] == line["output_sha256"] and not again["seed_drawn"]


def test_log_line_replays_a_sampled_speculated_request(server, tokenizer):
    """A repeating prompt at a low temperature: the adaptive n-gram policy drafts and some drafts are accepted, so
    the replay goes through other verify steps (other draft lengths, a server in another state) than the original."""
    prompt = "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2, 3]\nw = [1, 2, 3]\nv ="
    options = dict(temperature=0.3, exclude_input_in_output=True, return_perf_metrics=True)
    with Stream(server.grpc_url) as s:
        rid = s.send(build_inputs(prompt, 48, **options), request_id="replay-speculated")
        original = s.wait([rid], 60)[rid]
    assert original.error is None, original.error
    assert max(c.total_accepted_draft_tokens for c in original.chunks) > 0, "no draft was accepted"
    line, = log_lines(server, "replay-speculated")
    assert line["seed_drawn"]
    with Stream(server.grpc_url) as s:
        rids = [s.send(build_inputs(prompt, line["sampling"]["max_tokens"], **replay_inputs(line, prompt),
                                    num_speculative_tokens=k), request_id=f"replay-speculated-{k}") for k in (None, 0)]
        replays = s.wait(rids, 60)
    for rid in rids:
        assert replays[rid].error is None and replays[rid].text == original.text, rid


def test_unseeded_requests_draw_different_seeds_and_greedy_logs_none(server):
    with Stream(server.grpc_url) as s:
        rids = [s.send(build_inputs("import", 4, temperature=0.8), request_id=f"seeds-{i}") for i in range(2)]
        rids.append(s.send(build_inputs("import", 4, temperature=0.0), request_id="seeds-greedy"))
        s.wait(rids, 60)
    a, = log_lines(server, "seeds-0")
    b, = log_lines(server, "seeds-1")
    g, = log_lines(server, "seeds-greedy")
    assert a["sampling"]["seed"] != b["sampling"]["seed"]
    assert g["sampling"]["seed"] is None and not g["seed_drawn"] and g["trace_id"] is None
