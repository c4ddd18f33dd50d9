"""TensorRT-LLM's LoRA tensors through the llm model: a PEFT adapter converted to ``lora_weights`` /
``lora_config`` gives the same greedy output as the adapter by name; a later request with the id alone hits the
cache; an id never sent fails with TensorRT-LLM's message, and bad tensors fail naming the tensor."""
from __future__ import annotations

import numpy as np
import pytest

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.lora.trtllm import trtllm_tensors
from backend.serving.llm_serving import LLMServing
from contracts import wire
from contracts.sampling_params import SamplingParams
from tests.helpers.lora import fp16_exact
from tests.helpers.triton_fakes import Request, make_pb_utils
from bench.harness.lora_adapters import make_adapter

PROMPT = [0, 55, 66, 77, 88, 99, 1000, 55, 66, 77]


@pytest.fixture(scope="module")
def served(demo_target, tmp_path_factory):
    folder = make_adapter(demo_target, tmp_path_factory.mktemp("lora") / "qv8", rank=8, alpha=8,
                          targets=("q_proj", "v_proj", "down_proj"), scale=0.12, seed=5)
    fp16_exact(folder)   # and scaling 1: FP16 tensors carry the weights exactly
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(demo_target), lora_adapters=(("qv8", str(folder)),),
                                                  fast_decode=True)).start()
    serving = LLMServing(engine, make_pb_utils(), cancel_poll_interval_s=0.01)
    yield engine, serving
    serving.shutdown()
    engine.shutdown()


def run(serving, lora_name=None, **tensors) -> tuple[list[int], str | None]:
    """Greedy tokens of one non-streamed request, and its error."""
    req = wire.LLMRequest(SamplingParams(max_tokens=8, min_tokens=8, temperature=0.0, lora_name=lora_name),
                          stream=False)
    r = Request({wire.INPUT_IDS: np.asarray([PROMPT], dtype=np.int32),
                 wire.REQUEST: np.asarray([[req.to_json().encode()]], dtype=object), **tensors})
    serving.execute([r])
    assert r.sender.closed.wait(60), "no final response"
    resp, _ = r.sender.sent[-1]
    if resp.has_error():
        return [], resp.error().message()
    meta = wire.LLMResponseMeta.from_json(resp.tensor(wire.RESPONSE).reshape(-1)[0])
    return resp.tensor(wire.OUTPUT_IDS).reshape(-1).tolist(), meta.error


def test_converted_adapter_matches_by_name_and_is_cached(served):
    engine, serving = served
    by_name, err = run(serving, "qv8")
    base, _ = run(serving)
    assert err is None and by_name != base
    weights, config = trtllm_tensors(engine.lora.registry.get("qv8"))
    first, err = run(serving, lora_task_id=np.asarray([[7]], dtype=np.uint64),
                     lora_weights=weights[None].astype(np.float16), lora_config=config[None])
    assert err is None and first == by_name
    again, err = run(serving, lora_task_id=np.asarray([[7]], dtype=np.uint64))   # the id alone: from the cache
    assert err is None and again == by_name
    assert engine.lora.registry.task("trtllm-task-7") is not None


def test_uncached_id_and_bad_tensors_fail_naming_them(served):
    engine, serving = served
    _, err = run(serving, lora_task_id=np.asarray([[9]], dtype=np.uint64))
    assert "LoRA task 9 not found in cache. Please send LoRA weights with request" in err
    weights, config = trtllm_tensors(engine.lora.registry.get("qv8"))
    bad = config.copy()
    bad[0, 0] = 0                                               # the fused attn_qkv module
    _, err = run(serving, lora_task_id=np.asarray([[10]], dtype=np.uint64),
                 lora_weights=weights[None].astype(np.float16), lora_config=bad[None])
    assert err.startswith("lora_config: row 0: module id 0")
    _, err = run(serving, lora_task_id=np.asarray([[11]], dtype=np.uint64),
                 lora_weights=weights[None, :, :-5].astype(np.float16), lora_config=config[None])
    assert err.startswith("lora_weights: row")
    _, err = run(serving, lora_weights=weights[None].astype(np.float16))
    assert err.startswith("lora_task_id: required")
    _, err = run(serving, "nope")
    assert "lora_name: unknown adapter 'nope'" in err
    assert run(serving, "qv8")[1] is None                       # still serving
