"""Oracle for sliding-window attention: prompts longer than the window, greedy outputs equal HF
transformers' token for token (Mistral: every layer windowed, so blocks behind the window are freed
while the sequence runs; Qwen2: use_sliding_window with max_window_layers, full and windowed layers
mixed), alone and under concurrency, with chunked prefill, n-gram and draft-model speculation and
preemption, on the eager path and on the native step. The same prompts served without the window differ from HF's,
so the test can fail."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.native_decode import NativeDecodeStep
from contracts.sampling_params import SamplingParams
from tests.backend.engine.test_engine_oracle import check_variant_matches
from tests.helpers.checkpoints import make_random_checkpoint
from tests.helpers.oracle import hf_greedy, repeating_prompts

WINDOW = 16
NEW_TOKENS = 24
MODELS = {
    "mistral": {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": WINDOW},
    # 3 layers, windows on layers 1 and 2 only (transformers: layer i slides iff i >= max_window_layers)
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": True,
              "sliding_window": WINDOW, "max_window_layers": 1, "num_hidden_layers": 3},
}


def small_biases(folder) -> None:
    """make_random_checkpoint draws every 1-d tensor near 1 (norm weights); q/k/v biases that large make
    every position attend alike and the greedy output one repeated token. Redraw them small."""
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    gen = torch.Generator().manual_seed(0)
    for name, t in tensors.items():
        if name.endswith("_proj.bias"):
            tensors[name] = torch.randn(t.shape, generator=gen) * 0.1
    save_file(tensors, str(path), metadata={"format": "pt"})


def without_window(folder):
    """The same checkpoint in transformers with every layer on full attention."""
    cfg = AutoConfig.from_pretrained(str(folder))
    cfg.layer_types = ["full_attention"] * cfg.num_hidden_layers
    if cfg.model_type == "mistral":
        cfg.sliding_window = None
    return AutoModelForCausalLM.from_pretrained(str(folder), config=cfg, dtype=torch.float32).eval()


def make_prompts(seed: int, n: int = 10) -> list[list[int]]:
    """22..69 tokens (the window is 16), most repeating a span (n-gram drafts), half sharing a stem."""
    prompts = repeating_prompts(seed, n, stem_len=20, span_range=(6, 14), gap_range=(8, 20), gap_always=True)
    assert all(len(p) > WINDOW for p in prompts)
    return prompts


@pytest.fixture(scope="module", params=list(MODELS))
def setup(request, tmp_path_factory):
    extra = MODELS[request.param]
    folder = make_random_checkpoint(tmp_path_factory.mktemp(request.param) / "ckpt", extra=extra, tie=False,
                                    layers=extra.get("num_hidden_layers", 2), max_pos=256, seed=3)
    small_biases(folder)
    prompts = make_prompts(seed=5)
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    expected = [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]
    unwindowed = without_window(folder)
    differs = sum(hf_greedy(unwindowed, p, NEW_TOKENS) != e for p, e in zip(prompts, expected))
    assert differs >= len(prompts) // 2, "the window should change most outputs, or this test proves nothing"
    return request.param, folder, prompts, expected


VARIANTS = {
    "plain": {},
    "chunked_prefill": {"max_num_batched_tokens": 8},
    "ngram": {"speculative_method": "ngram", "num_speculative_tokens": 4, "speculative_adaptive": False,
              "max_num_batched_tokens": 24},
    "draft": {"speculative_method": "draft", "num_speculative_tokens": 3, "speculative_adaptive": False},
    "preemption": {"num_kv_blocks": 8, "max_model_len": 128, "watermark": 0.0, "block_size": 16, "max_num_batched_tokens": 16,
                   "speculative_method": "ngram", "num_speculative_tokens": 2},
}
# the same on the native step (fast_decode): its paged attention honours each layer's window
VARIANTS.update({f"native_{name}": {**kw, "fast_decode": True} for name, kw in list(VARIANTS.items())})


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_sliding_window_greedy_matches_hf(setup, variant):
    name, folder, prompts, expected = setup
    kw = dict(model_path=str(folder), max_num_seqs=16, kv_cache_bytes=16 << 20, device="cpu", **VARIANTS[variant])
    if variant.endswith("draft"):
        kw["draft_model_path"] = str(folder)       # the target as its own draft: windowed draft attention too
    engine = LLMEngine(EngineConfig.from_settings(**kw))
    assert isinstance(engine.runner.fast_decode, NativeDecodeStep) == variant.startswith("native")
    if variant == "native_draft":
        assert engine.speculator.proposer.forward.native is not None, "the draft's steps should run natively too"
    burst = variant.endswith("preemption")          # one burst: the small pool runs out on any machine
    check_variant_matches(engine, prompts, expected, NEW_TOKENS, f"{name}/{variant}: ", burst=burst,
                          speculative=variant.endswith(("ngram", "draft")))


@pytest.mark.parametrize("fast_decode", [False, True])
def test_blocks_behind_the_window_are_freed_while_running(setup, fast_decode):
    """Mistral windows every layer: one long request holds at most the window's blocks plus a chunk's (the native
    step's table then holds NULL_BLOCK entries it never reads)."""
    name, folder, prompts, _ = setup
    if name != "mistral":
        pytest.skip("Qwen2 here keeps a full-attention layer, so no block ever falls out of every window")
    engine = LLMEngine(EngineConfig.from_settings(model_path=str(folder), kv_cache_bytes=16 << 20, device="cpu",
                                                  block_size=16, max_num_batched_tokens=16, fast_decode=fast_decode))
    assert isinstance(engine.runner.fast_decode, NativeDecodeStep) == fast_decode
    prompt = prompts[0] * 4                         # well past the window
    engine.add_request("long", prompt, SamplingParams(max_tokens=60, ignore_eos=True, temperature=0.0),
                       lambda out: None)
    peak = 0
    while engine.has_work():
        engine.step()
        peak = max(peak, engine.stats().kv_blocks_used)
    # window 16 + a 16-token chunk: the 15 keys before a chunk and the chunk span at most 3 blocks of 16
    assert peak <= 3, f"held {peak} blocks; the whole context would take {-(-(len(prompt) + 60) // 16)}"
    assert engine.stats().kv_blocks_used == 0
