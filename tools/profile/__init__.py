"""Micro-benchmarks of the native kernels and the decode step: timings to compare within one run, no goals."""
