"""CUDA-graph decode steps (backend/engine/cuda_graph_decode.py): off without CUDA; on CUDA, the captured
step's logits equal the eager step's and greedy tokens are the same with capture on and off; on the CPU, the
graph's per-token inputs of verify steps computed as the captured step would give the native step's logits."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from backend.config import EngineConfig
from backend.core.kv_cache import KVCache
from backend.engine.cuda_graph_decode import CudaGraphDecodeStep, batch_buckets, fits, static_inputs
from backend.engine.llm_engine import LLMEngine, output_token_ids
from backend.model.config import ModelConfig
from backend.model.llama import LlamaForCausalLM
from contracts.sampling_params import SamplingParams
from tests.helpers.oracle import repeating_prompts


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
@pytest.mark.parametrize("spec", ["none", "ngram"])   # ngram: verify steps captured too
def test_captured_decode_matches_eager_on_cuda(tiny_checkpoint, spec):
    prompts = [[0] + list(range(10 + i, 40 + 3 * i)) for i in range(5)]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    kw = {"model_path": str(tiny_checkpoint), "device": "cuda", "dtype": "float32", "max_num_seqs": 8,
          "gpu_memory_utilization": 0.3, "max_model_len": 512, "speculative_method": spec,
          "num_speculative_tokens": 3}
    expected = [output_token_ids(o) for o in LLMEngine(EngineConfig.from_settings(**kw)).generate(prompts, params)]
    engine = LLMEngine(EngineConfig.from_settings(**kw, fast_decode=True))
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


class RowDecodeAttention:
    """What a captured step's attention computes (StaticDecodeAttention: reshape_and_cache of every row, then the
    paged decode kernel per row), in torch on the CPU, from the graph's per-token rows (``static_inputs``)."""

    def __init__(self, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor], rows: dict, block_size: int):
        self.k_cache, self.v_cache, self.rows, self.block_size = k_cache, v_cache, rows, block_size

    def prepare(self, metadata) -> None:
        pass

    def forward(self, layer_idx, q, k, v):
        # q: [B, num_heads, head_dim]; k, v: [B, num_kv_heads, head_dim]; caches [blocks, block_size, KVH, hd]
        kc, vc, bs = self.k_cache[layer_idx], self.v_cache[layer_idx], self.block_size
        slots = torch.from_numpy(self.rows["slots"])
        kc.view(-1, *kc.shape[2:])[slots] = k
        vc.view(-1, *vc.shape[2:])[slots] = v
        out = torch.empty_like(q)
        group = q.shape[1] // k.shape[1]
        for i, n in enumerate(self.rows["lens"].tolist()):
            blocks = torch.from_numpy(self.rows["tables"][i, :-(-n // bs)].astype(np.int64))
            keys = kc[blocks].reshape(-1, *kc.shape[2:])[:n].repeat_interleave(group, 1)    # [n, H, hd]
            values = vc[blocks].reshape(-1, *vc.shape[2:])[:n].repeat_interleave(group, 1)
            scores = torch.einsum("hd,nhd->hn", q[i], keys) / math.sqrt(q.shape[-1])
            out[i] = torch.einsum("hn,nhd->hd", scores.softmax(-1), values)
        return out


def test_verify_steps_as_rows_per_token_match_the_native_step(tiny_checkpoint):
    """CPU-side check of captured verify steps (never run on a GPU here): for the verify steps of a real n-gram
    speculation run, the graph's inputs (one row per token: its sequence's table, context position + 1, its
    slot) fed through the model with the captured step's attention give the native verify step's logits."""
    prompts = repeating_prompts(3, 6, stem_len=20, span_range=(4, 12), gap_range=(2, 20))
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(tiny_checkpoint), block_size=4, max_num_seqs=8,
                                                  max_model_len=128, speculative_method="ngram",
                                                  num_speculative_tokens=3, speculative_adaptive=False,
                                                  fast_decode=True, device="cpu"))
    runner, checked = engine.runner, []
    width = -(-128 // 4)
    execute = runner.execute

    def compare(plan):
        if len(checked) == 6 or not (fits(plan, 64) and any(s.num_draft_tokens for s in plan.scheduled)):
            return execute(plan)
        rows = static_inputs(runner.fast_decode.batch.prepare(plan), 4, width)
        rows = {k: v.copy() for k, v in rows.items()}
        kv = runner.kv_cache.data.clone()
        attn = RowDecodeAttention(list(kv[0].unbind(0)), list(kv[1].unbind(0)), rows, 4)
        with torch.inference_mode():
            emulated = runner.model.compute_logits(runner.model(torch.from_numpy(rows["ids"]),
                                                                torch.from_numpy(rows["pos"]), attn))
        out = execute(plan)
        torch.testing.assert_close(emulated, out.logits, atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(kv, runner.kv_cache.data, atol=1e-5, rtol=1e-5)   # the same K/V slots written
        checked.append(plan.num_batched_tokens)
        return out

    runner.execute = compare
    engine.generate(prompts, params)
    assert len(checked) == 6 and max(checked) > len(prompts)    # verify steps with drafts were compared
