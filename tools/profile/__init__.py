"""One-off profiling scripts for the engine's hot paths (not benchmarks: they print timings, no goal)."""
