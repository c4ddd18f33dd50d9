"""``EngineStats``: what ``LLMEngine.stats()`` reports (the metrics thread publishes it as gauges)."""
from __future__ import annotations

from dataclasses import dataclass, field

from backend.core.scheduler_stats import SchedulerStats, SpecDecodeCounters
from backend.engine.loop_clock import LoopTime


@dataclass(frozen=True)
class EngineStats:
    kv_blocks_max: int
    kv_blocks_used: int
    kv_blocks_free: int
    kv_blocks_reused: int          # blocks served from the prefix cache, cumulative
    tokens_per_block: int
    num_running: int
    num_waiting: int
    num_prefilling: int            # running sequences with more than one token left to compute (prompt chunks)
    num_scheduled: int             # sequences in the last step
    num_preemptions: int
    prefix_cache_queries: int      # prompt tokens looked up in the prefix cache, cumulative
    prefix_cache_hits: int         # of which were found
    steps: int
    spec: SpecDecodeCounters = field(default_factory=SpecDecodeCounters)   # speculative decoding, cumulative
    loop: LoopTime | None = None   # the loop thread's step time: CPU, run queue, blocked (None: no loop thread)


def engine_stats(s: SchedulerStats, block_size: int, steps: int, loop: LoopTime | None) -> EngineStats:
    """The scheduler's counts in the engine's terms (KV in blocks of ``block_size`` tokens)."""
    return EngineStats(
        kv_blocks_max=s.num_kv_blocks, kv_blocks_used=s.num_used_blocks, kv_blocks_free=s.num_free_blocks,
        kv_blocks_reused=s.prefix_cache_hits // block_size, tokens_per_block=block_size,
        num_running=s.num_running, num_waiting=s.num_waiting, num_prefilling=s.num_prefilling,
        num_scheduled=s.num_scheduled, num_preemptions=s.num_preemptions,
        prefix_cache_queries=s.prefix_cache_queries, prefix_cache_hits=s.prefix_cache_hits, steps=steps,
        spec=s.spec, loop=loop)
