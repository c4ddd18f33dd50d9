"""The model: architecture config, the Llama forward, RoPE, and the HF-folder loader."""
