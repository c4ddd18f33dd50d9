"""LoRA through the server: 32 concurrent greedy streams (8 under each of three adapters, 8 on the base model)
each equal HF transformers with PEFT applying the same adapter (with the session server's n-gram speculation on);
TensorRT-LLM's tensors give the same text as the adapter by name and are cached by id; an unknown adapter fails
naming it, and the server keeps serving; the LoRA gauges are published."""
from __future__ import annotations

import numpy as np

from backend.lora.adapter import load_adapter
from backend.lora.trtllm import trtllm_tensors
from backend.model.config import ModelConfig
from cli.client import build_inputs
from tests.e2e.helpers import Stream, gauge, metrics, raw_input, wait_until
from tests.helpers.lora import ADAPTERS, peft_greedy

PROMPTS = ["def fibonacci(n):", "import os\nimport", "class Stack:\n    def", "for i in range(",
           "# parse the file\nwith open(", "x = [1, 2, 3]\ny =", "def main():\n    args =", "return sorted("]
NEW_TOKENS = 12


def greedy(prompt: str, **options) -> list:
    return build_inputs(prompt, NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=0.0, exclude_input_in_output=True,
                        stream=True, **options)


def test_mixed_adapters_match_peft_through_the_server(server, lora_adapters, tokenizer):
    ids = [tokenizer.encode(p) for p in PROMPTS]
    names = [None, *ADAPTERS]
    expected = {n: [tokenizer.decode(t) for t in peft_greedy(server.model_path, lora_adapters.get(n), ids,
                                                             NEW_TOKENS)] for n in names}
    for n in ADAPTERS:
        assert sum(a != b for a, b in zip(expected[n], expected[None])) >= len(PROMPTS) / 2, n
    with Stream(server.grpc_url) as s:
        rids = {s.send(greedy(p, lora_name=n)): (n, i) for i, p in enumerate(PROMPTS) for n in names}
        results = s.wait(list(rids), 180)
    for rid, (n, i) in rids.items():
        assert results[rid].error is None, results[rid].error
        assert results[rid].text == expected[n][i], f"adapter {n}, prompt {i}"


def test_trtllm_tensors_by_id_and_errors(server, lora_adapters):
    cfg = ModelConfig.from_file(server.model_path / "config.json")
    weights, config = trtllm_tensors(load_adapter(lora_adapters["qv8"], "qv8", cfg))
    lora = [raw_input("lora_task_id", np.asarray([[21]], dtype=np.uint64), "UINT64"),
            raw_input("lora_weights", weights[None].astype(np.float16), "FP16"),
            raw_input("lora_config", config[None], "INT32")]
    results = {}
    with Stream(server.grpc_url) as s:   # one at a time: an error response carries no request id on this API
        for key, inputs in (("first", greedy(PROMPTS[0]) + lora), ("again", greedy(PROMPTS[0]) + lora[:1]),
                            ("unknown_id", greedy(PROMPTS[0]) + [raw_input(
                                "lora_task_id", np.asarray([[22]], dtype=np.uint64), "UINT64")]),
                            ("unknown", greedy(PROMPTS[0], lora_name="nope")),
                            ("by_name", greedy(PROMPTS[0], lora_name="qv8"))):
            rid = s.send(inputs)
            results[key] = s.wait([rid], 60)[rid]
    assert results["first"].error is None and results["again"].error is None
    assert results["first"].text == results["by_name"].text == results["again"].text   # fp16-exact adapters
    assert "LoRA task 22 not found in cache. Please send LoRA weights with request" in results["unknown_id"].error
    assert "lora_name: unknown adapter 'nope'" in results["unknown"].error
    # the gauges refresh every metrics_interval_s: the last request may still count for a moment
    wait_until(lambda: gauge(server.metrics_url, "triton_llm_lora_requests", lora_name="qv8", state="running") == 0,
               10, "no request running under qv8 once every stream has ended")


def test_the_chart_picker_config_selects_series_of_the_server(server):
    """Each metric spec of the endpoint picker's engine entry in the chart (llm-d's PromQL-selector syntax)
    selects a series the live server publishes; the LoRA one carries the labels the picker reads."""
    from tests.helm.test_inferencepool import picker_engine_config, parse_spec

    engine = picker_engine_config()
    for key in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "cacheBlockSizeSpec",
                "cacheNumBlocksSpec", "loraSpec"):
        name, labels = parse_spec(engine[key])
        gauge(server.metrics_url, name, **labels)  # KeyError names the spec that selects nothing
    name, _ = parse_spec(engine["loraSpec"])
    series = [dict(ls) for (n, ls), _ in metrics(server.metrics_url).items() if n == name]
    assert series and all({"running_lora_adapters", "waiting_lora_adapters", "max_lora"} <= s.keys() for s in series)
    assert all(int(s["max_lora"]) >= 1 for s in series)
