"""Parameter names users bring from TensorRT-LLM's Triton backend and from vLLM, and our answer to each.

None of them is accepted: a model refuses every parameter it does not read (``check_known_parameters``
in ``contracts/triton_config.py``), and for these names the refusal says what to set instead
(``kv_cache_free_gpu_mem_fraction: not a parameter of the llm model (TensorRT-LLM's name; set
llm.gpu_memory_utilization or llm.kv_cache_bytes: ...)``) or that there is nothing like it here. Names that vLLM and this engine share (``gpu_memory_utilization``,
``max_model_len``, ``enable_prefix_caching``, ``max_num_seqs``, ...) are ours and are not listed.

Sources: the parameters of TensorRT-LLM backend's ``all_models/inflight_batcher_llm`` models
(``tensorrt_llm``, ``preprocessing``, ``postprocessing``, ``tensorrt_llm_bls``) and the template
variables of their ``fill_template.py`` (``batching_strategy``, ``engine_dir``, ...), vLLM's engine
arguments, and the parameters of Triton's vLLM backend. The table is documented in docs/deploy.md
("9. Model parameters: every key is read, or refused"); ``tests/contracts/test_model_parameters.py`` keeps the
two in step.
"""
from __future__ import annotations

from dataclasses import dataclass

TRTLLM = "TensorRT-LLM"
VLLM = "vLLM"
BOTH = "TensorRT-LLM and vLLM"


@dataclass(frozen=True)
class ForeignParameter:
    """``use``: our equivalents as ``MODEL.KEY`` (what ``--set`` takes), empty when there is none;
    ``note``: how ours differs, or why there is nothing to set (required without ``use``)."""

    name: str
    origin: str
    use: tuple[str, ...] = ()
    note: str = ""

    def __post_init__(self) -> None:
        if not self.use and not self.note:
            raise ValueError(f"{self.name}: a foreign parameter without an equivalent needs a note")

    def answer(self, model: str) -> str:
        """What the refusal says to a user who set it on ``model``: the equivalents of that model when it
        has any, else all of them."""
        if not self.use:
            return f"{self.origin}'s name; not implemented here: {self.note}"
        mine = [u for u in self.use if u.split(".", 1)[0] == model]
        named = " or ".join(mine or self.use)
        return f"{self.origin}'s name; set {named}" + (f": {self.note}" if self.note else "")


def _table(*entries: ForeignParameter) -> dict[str, ForeignParameter]:
    out = {}
    for e in entries:
        if e.name in out:
            raise ValueError(f"{e.name}: listed twice")
        out[e.name] = e
    return out


_ONE_GPU = "one engine runs on one GPU; scale out with replicas (docs/deploy.md)"
_TOKENIZER = ("preprocess.tokenizer_path", "postprocess.tokenizer_path")

FOREIGN_PARAMETERS: dict[str, ForeignParameter] = _table(
    # ---- TensorRT-LLM's tensorrt_llm model
    ForeignParameter("gpt_model_path", TRTLLM, ("llm.model_path",), "a Hugging Face checkpoint folder, not an engine"),
    ForeignParameter("engine_dir", TRTLLM, ("llm.model_path",), "a Hugging Face checkpoint folder, not an engine"),
    ForeignParameter("gpt_model_type", TRTLLM, (), "the engine always batches in flight; remove it"),
    ForeignParameter("batching_strategy", TRTLLM, (), "the engine always batches in flight; remove it"),
    ForeignParameter("max_beam_width", TRTLLM, (), "no beam search (the beam_width input accepts 1)"),
    ForeignParameter("kv_cache_free_gpu_mem_fraction", TRTLLM, ("llm.gpu_memory_utilization", "llm.kv_cache_bytes"),
                     "ours is a fraction of the whole GPU's memory, weights included, or the KV pool in bytes"),
    ForeignParameter("max_tokens_in_paged_kv_cache", TRTLLM, ("llm.num_kv_blocks", "llm.kv_cache_bytes"),
                     "blocks of llm.block_size tokens: tokens / block_size"),
    ForeignParameter("max_num_sequences", TRTLLM, ("llm.max_num_seqs",)),
    ForeignParameter("max_batch_size", TRTLLM, ("llm.max_num_seqs",), "sequences running at once"),
    ForeignParameter("max_num_tokens", TRTLLM, ("llm.max_num_batched_tokens",), "tokens computed per step"),
    ForeignParameter("max_queue_size", TRTLLM, ("llm.max_queued_requests",),
                     "requests held beyond max_num_seqs before the next is refused"),
    ForeignParameter("batch_scheduler_policy", TRTLLM, (),
                     "the scheduler admits while KV blocks last (less llm.watermark) and preempts by recompute"),
    ForeignParameter("max_attention_window_size", TRTLLM, (), "sliding windows come from the checkpoint's config.json"),
    ForeignParameter("sink_token_length", TRTLLM, (), "no attention sinks"),
    ForeignParameter("encoder_model_path", TRTLLM, (), "decoder-only models only (Llama, Mistral, Qwen2, Qwen3, "
                     "Phi-3, Gemma 3)"),
    ForeignParameter("encoder_engine_dir", TRTLLM, (), "decoder-only models only (Llama, Mistral, Qwen2, Qwen3, "
                     "Phi-3, Gemma 3)"),
    ForeignParameter("cross_kv_cache_fraction", TRTLLM, (), "decoder-only models only (Llama, Mistral, Qwen2, Qwen3, "
                     "Phi-3, Gemma 3)"),
    ForeignParameter("kv_cache_host_memory_bytes", TRTLLM, (), "no host offload of KV blocks"),
    ForeignParameter("kv_cache_onboard_blocks", TRTLLM, (), "no host offload of KV blocks"),
    ForeignParameter("enable_trt_overlap", TRTLLM, (), "a TensorRT option"),
    ForeignParameter("exclude_input_in_output", TRTLLM, (), "a request input of the ensemble instead (docs/api.md)"),
    ForeignParameter("cancellation_check_period_ms", TRTLLM, ("llm.cancel_poll_interval_s",), "in seconds"),
    ForeignParameter("stats_check_period_ms", TRTLLM, ("llm.metrics_interval_s",), "in seconds"),
    ForeignParameter("iter_stats_max_iterations", TRTLLM, (),
                     "the engine's statistics are Prometheus metrics (docs/observability.md)"),
    ForeignParameter("request_stats_max_iterations", TRTLLM, (),
                     "the engine's statistics are Prometheus metrics (docs/observability.md)"),
    ForeignParameter("enable_kv_cache_reuse", TRTLLM, ("llm.enable_prefix_caching",), "on by default"),
    ForeignParameter("normalize_log_probs", TRTLLM, (), "log probabilities are of the raw model distribution"),
    ForeignParameter("enable_chunked_context", TRTLLM, ("llm.max_num_batched_tokens",),
                     "prefill is always chunked; this caps a step's tokens"),
    ForeignParameter("gpu_device_ids", TRTLLM, ("llm.device",), "cuda or cuda:N, one GPU"),
    ForeignParameter("participant_ids", TRTLLM, (), _ONE_GPU),
    ForeignParameter("num_nodes", TRTLLM, (), _ONE_GPU),
    ForeignParameter("executor_worker_path", TRTLLM, (), "the engine runs inside the llm model's Python stub"),
    ForeignParameter("lora_cache_optimal_adapter_size", TRTLLM, (), "no paged adapter cache; llm.max_lora_rank sizes "
                     "the adapter stacks"),
    ForeignParameter("lora_cache_max_adapter_size", TRTLLM, ("llm.max_lora_rank",), "the highest rank served"),
    ForeignParameter("lora_cache_gpu_memory_fraction", TRTLLM, ("llm.max_loras",),
                     "a count of adapters resident at once, not a fraction"),
    ForeignParameter("lora_cache_host_memory_bytes", TRTLLM, ("llm.max_cpu_loras",),
                     "a count of adapters kept in memory, not bytes"),
    ForeignParameter("lora_prefetch_dir", TRTLLM, ("llm.lora_dir",), "every adapter sub-folder, served by its name"),
    ForeignParameter("decoding_mode", TRTLLM, ("llm.speculative_method",),
                     "speculation: none, ngram or draft; sampling is chosen per request; no beam search"),
    ForeignParameter("lookahead_window_size", TRTLLM, (), "no lookahead decoding; n-gram prompt lookup is "
                     "llm.speculative_method=ngram"),
    ForeignParameter("lookahead_ngram_size", TRTLLM, (), "no lookahead decoding; n-gram prompt lookup is "
                     "llm.speculative_method=ngram"),
    ForeignParameter("lookahead_verification_set_size", TRTLLM, (), "no lookahead decoding; n-gram prompt lookup is "
                     "llm.speculative_method=ngram"),
    ForeignParameter("medusa_choices", TRTLLM, (), "no Medusa heads; speculation is ngram or a draft model"),
    ForeignParameter("eagle_choices", TRTLLM, (), "no EAGLE heads; speculation is ngram or a draft model"),
    ForeignParameter("speculative_decoding_fast_logits", TRTLLM, (),
                     "a draft model runs in the same engine (llm.draft_model_path)"),
    ForeignParameter("gpu_weights_percent", TRTLLM, (), "no weight streaming"),
    ForeignParameter("enable_context_fmha_fp32_acc", TRTLLM, (), "a TensorRT kernel option"),
    ForeignParameter("multi_block_mode", TRTLLM, (), "a TensorRT kernel option"),
    ForeignParameter("cuda_graph_mode", TRTLLM, ("llm.fast_decode",), "CUDA graphs of decode and verify steps on CUDA"),
    ForeignParameter("cuda_graph_cache_size", TRTLLM, (), "the graphs kept are the engine's own (llm.fast_decode)"),
    ForeignParameter("guided_decoding_backend", BOTH, (), "guided decoding is always on, with xgrammar"),
    ForeignParameter("xgrammar_tokenizer_info_path", TRTLLM, (),
                     "the grammar layer reads the tokenizer of llm.model_path"),
    ForeignParameter("tokenizer_dir", TRTLLM, _TOKENIZER, "each model's tokenizer folder; the llm model reads its "
                     "tokenizer from llm.model_path"),
    # ---- TensorRT-LLM's preprocessing, postprocessing and BLS models
    ForeignParameter("add_special_tokens", TRTLLM, (), "a prompt gets its tokenizer's special tokens (BOS); a chat "
                     "template writes its own"),
    ForeignParameter("multimodal_model_path", TRTLLM, (), "text models only"),
    ForeignParameter("max_num_images", TRTLLM, (), "text models only"),
    ForeignParameter("skip_special_tokens", TRTLLM, (), "a request input of the ensemble instead (docs/api.md)"),
    ForeignParameter("accumulate_tokens", TRTLLM, (), "a streamed response carries the new text; the ensemble "
                     "has no BLS model"),
    ForeignParameter("tensorrt_llm_model_name", TRTLLM, (), "the ensemble has no BLS model"),
    ForeignParameter("tensorrt_llm_draft_model_name", TRTLLM, ("llm.draft_model_path",),
                     "a draft checkpoint served by the same engine, with llm.speculative_method=draft"),
    # ---- vLLM's engine arguments
    ForeignParameter("model", VLLM, ("llm.model_path",), "a local checkpoint folder"),
    ForeignParameter("tokenizer", VLLM, _TOKENIZER),
    ForeignParameter("tensor_parallel_size", VLLM, (), _ONE_GPU),
    ForeignParameter("pipeline_parallel_size", VLLM, (), _ONE_GPU),
    ForeignParameter("data_parallel_size", VLLM, (), _ONE_GPU),
    ForeignParameter("distributed_executor_backend", VLLM, (), _ONE_GPU),
    ForeignParameter("enable_expert_parallel", VLLM, (), "dense models only (Llama, Mistral, Qwen2, Qwen3, Phi-3, "
                     "Gemma 3)"),
    ForeignParameter("speculative_config", VLLM, ("llm.speculative_method",), "its fields are parameters of their "
                     "own: llm.num_speculative_tokens, llm.draft_model_path, llm.ngram_min, llm.ngram_max"),
    ForeignParameter("speculative_model", VLLM, ("llm.draft_model_path",), "with llm.speculative_method=draft"),
    ForeignParameter("ngram_prompt_lookup_max", VLLM, ("llm.ngram_max",)),
    ForeignParameter("ngram_prompt_lookup_min", VLLM, ("llm.ngram_min",)),
    ForeignParameter("num_gpu_blocks_override", VLLM, ("llm.num_kv_blocks",)),
    ForeignParameter("swap_space", VLLM, (), "a preempted sequence is recomputed, not swapped"),
    ForeignParameter("cpu_offload_gb", VLLM, (), "no weight offload"),
    ForeignParameter("preemption_mode", VLLM, (), "a preempted sequence is recomputed, not swapped"),
    ForeignParameter("enforce_eager", VLLM, ("llm.fast_decode",), "fast_decode=false runs every step eagerly"),
    ForeignParameter("max_seq_len_to_capture", VLLM, (), "the graphs kept are the engine's own (llm.fast_decode)"),
    ForeignParameter("enable_chunked_prefill", VLLM, ("llm.max_num_batched_tokens",),
                     "prefill is always chunked; this caps a step's tokens"),
    ForeignParameter("enable_lora", VLLM, ("llm.lora_adapters", "llm.lora_dir"),
                     "LoRA is on when adapters are configured"),
    ForeignParameter("lora_modules", VLLM, ("llm.lora_adapters",), "name=folder pairs separated by commas"),
    ForeignParameter("disable_log_requests", VLLM, ("llm.request_log_level",), "off: no per-request log line"),
    ForeignParameter("disable_log_stats", VLLM, (), "the engine's statistics are Prometheus metrics, always exported"),
    ForeignParameter("trust_remote_code", VLLM, (), "the architectures are built in (Llama, Mistral, Qwen2, Qwen3, "
                     "Phi-3, Gemma 3); no checkpoint code runs"),
    ForeignParameter("revision", VLLM, (), "the checkpoint is a local folder"),
    ForeignParameter("download_dir", VLLM, (), "the checkpoint is a local folder"),
    ForeignParameter("load_format", VLLM, (), "safetensors checkpoints only"),
    ForeignParameter("tokenizer_mode", VLLM, (), "the tokenizer folder's tokenizer.json is used"),
    ForeignParameter("served_model_name", VLLM, (),
                     "the OpenAI API serves the name of llm.model_path's folder (and ensemble)"),
    ForeignParameter("max_logprobs", VLLM, (), "top_logprobs is bounded at 20 (OpenAI's bound)"),
    ForeignParameter("num_scheduler_steps", VLLM, (), "one scheduling decision per step"),
    ForeignParameter("scheduler_delay_factor", VLLM, (), "waiting requests are admitted first come, first served"),
    ForeignParameter("scheduling_policy", VLLM, (), "first come, first served"),
    ForeignParameter("rope_scaling", VLLM, (), "read from the checkpoint's config.json"),
    ForeignParameter("rope_theta", VLLM, (), "read from the checkpoint's config.json"),
    ForeignParameter("hf_overrides", VLLM, (), "the checkpoint's config.json is read as it is"),
    ForeignParameter("disable_sliding_window", VLLM, (), "sliding windows come from the checkpoint's config.json"),
    ForeignParameter("compilation_config", VLLM, (), "no torch.compile; llm.fast_decode selects the native step"),
    ForeignParameter("kv_transfer_config", VLLM, (), "no disaggregated prefill"),
    ForeignParameter("enable_sleep_mode", VLLM, (), "the engine stays loaded while the model is"),
    ForeignParameter("generation_config", VLLM, (), "sampling defaults are the ensemble inputs' (docs/api.md); "
                     "generation_config.json gives the EOS ids"),
    ForeignParameter("limit_mm_per_prompt", VLLM, (), "text models only"),
    # ---- Triton's vLLM backend
    ForeignParameter("REPORT_CUSTOM_METRICS", VLLM, (), "the engine's metrics are always reported"),
    ForeignParameter("ENABLE_VLLM_HEALTH_CHECK", VLLM, ("llm.engine_stall_timeout_s", "llm.engine_unhealthy_action"),
                     "the engine's health is always watched"),
)


def foreign_answer(name: str, model: str) -> str | None:
    """The answer to ``name`` set on ``model`` when it is another server's parameter, else None."""
    entry = FOREIGN_PARAMETERS.get(name)
    return entry.answer(model) if entry is not None else None
