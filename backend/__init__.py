"""The LLM engine: Llama-family model, paged KV cache, scheduler, sampler, engine loop."""
