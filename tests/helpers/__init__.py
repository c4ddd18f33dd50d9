"""Test helpers: checkpoints, the HF/dense oracles, a paged-attention reference, fake Triton objects."""
