"""The one load line: checkpoint, device, dtype, KV pool (blocks, tokens, bytes per token), sequences at
full context, sliding window, engine settings and speculation."""
from backend.config import EngineConfig
from backend.engine.builder import build_engine_parts
from tests.helpers.checkpoints import make_random_checkpoint


def test_summary_has_the_capacity_numbers(tiny_checkpoint):
    parts = build_engine_parts(EngineConfig.from_settings(model_path=str(tiny_checkpoint), device="cpu",
                                                          num_kv_blocks=100, block_size=16,
                                                          speculative_method="ngram", num_speculative_tokens=3))
    s = parts.summary
    # tiny: 2 layers, 2 KV heads x 16 dims, fp32: 2 (K, V) x 2 x 2 x 16 x 4 bytes = 512 bytes per token
    for text in (f"checkpoint {tiny_checkpoint} (Llama, 2 layers,", "on cpu in float32",
                 "KV pool 100 blocks x 16 = 1600 tokens (0.8 MiB, 512 bytes per token)",
                 "max_model_len 1024: 1 sequences at full context", "sliding window none",
                 "max_num_seqs 64, max_num_batched_tokens 1024, prefix caching on",
                 "speculation ngram k=3 adaptive"):
        assert text in s, (text, s)


def test_summary_of_a_sliding_window_model(tmp_path):
    folder = make_random_checkpoint(tmp_path / "m", extra={"architectures": ["MistralForCausalLM"],
                                                           "sliding_window": 64}, max_pos=1024)
    s = build_engine_parts(EngineConfig.from_settings(model_path=str(folder), device="cpu", num_kv_blocks=128,
                                                      max_num_batched_tokens=64)).summary
    assert "(Mistral, 2 layers" in s and "speculation off" in s
    # a sequence holds at most the window plus one chunk: 128 tokens = 8 blocks, so 128 / 8 = 16 sequences
    assert "sliding window 64 on every layer (a sequence holds <= 128 tokens of KV)" in s
    assert "16 sequences at full context" in s


def test_summary_says_how_the_draft_model_steps(tiny_checkpoint, tmp_path):
    window = make_random_checkpoint(tmp_path / "w", layers=1, hidden=32, heads=2, kv_heads=1, intermediate=64,
                                    extra={"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                                           "sliding_window": 16})
    # a sliding-window draft steps natively too; in bfloat16 (the op computes in float32) a draft steps eagerly
    for draft, dtype, text in ((tiny_checkpoint, "auto", "(draft steps native)"),
                               (window, "auto", "(draft steps native)"),
                               (tiny_checkpoint, "bfloat16",
                                "(draft steps eager: off (the native step needs float32 weights and KV cache))")):
        s = build_engine_parts(EngineConfig.from_settings(model_path=str(tiny_checkpoint), device="cpu",
                                                          num_kv_blocks=100,
                                                          speculative_method="draft", draft_model_path=str(draft),
                                                          fast_decode=True, dtype=dtype)).summary
        assert f"speculation draft k=4 adaptive draft={draft} {text}" in s, s
