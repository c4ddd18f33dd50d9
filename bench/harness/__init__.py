"""What the benchmarks share: closed-loop and sliced drives, workloads, statistics, reports, a server fixture."""
