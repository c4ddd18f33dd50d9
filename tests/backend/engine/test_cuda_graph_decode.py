"""CUDA-graph decode steps (backend/engine/cuda_graph_decode.py): off without CUDA; on CUDA, the captured
step's logits equal the eager step's and greedy tokens are the same with capture on and off."""
from __future__ import annotations

import pytest
import torch

from backend.config import EngineConfig
from backend.core.kv_cache import KVCache
from backend.engine.cuda_graph_decode import CudaGraphDecodeStep, batch_buckets
from backend.engine.llm_engine import LLMEngine, output_token_ids
from backend.model.config import ModelConfig
from backend.model.llama import LlamaForCausalLM
from contracts.sampling_params import SamplingParams


def test_buckets_cover_every_batch_size():
    assert batch_buckets(1) == [1]
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert batch_buckets(48) == [1, 2, 4, 8, 16, 32, 48]


def test_without_cuda_the_step_says_why():
    cfg = ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
                                 "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64})
    reason = CudaGraphDecodeStep.build(LlamaForCausalLM(cfg), KVCache(1, 4, 16, 2, 8), (None,), None, 4, 64)
    assert isinstance(reason, str) and "CUDA" in reason


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_decode_matches_eager_on_cuda(tiny_checkpoint):
    prompts = [[0] + list(range(10 + i, 40 + 3 * i)) for i in range(5)]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    kw = {"model_path": str(tiny_checkpoint), "device": "cuda", "dtype": "float32", "max_num_seqs": 8,
          "gpu_memory_utilization": 0.3, "max_model_len": 512}
    expected = [output_token_ids(o) for o in LLMEngine(EngineConfig(**kw)).generate(prompts, params)]
    engine = LLMEngine(EngineConfig(**kw, fast_decode=True))
    fast = engine.runner.fast_decode
    assert isinstance(fast, CudaGraphDecodeStep), engine.parts.summary
    assert [output_token_ids(o) for o in engine.generate(prompts, params)] == expected
    # one decode step both ways: the same K/V slots are written, the logits agree
    for i, p in enumerate(prompts[:3]):
        engine.add_request(f"x{i}", p, params, lambda out: None)
    engine.step()   # prefill
    plan = engine.scheduler.schedule()
    assert fast.accepts(plan)
    captured = fast.run(plan).logits
    engine.runner.fast_decode = None
    eager = engine.runner.execute(plan).logits
    torch.testing.assert_close(captured, eager, atol=1e-3, rtol=1e-3)
