"""Sampling: the per-step batch of sampling parameters, the pure maths, and the sampler."""
