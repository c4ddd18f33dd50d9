"""Engine gauges on Triton's metrics port, named as TensorRT-LLM's backend names them.

``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max|free|used|tokens_per|reused|fraction}``
(``fraction``: used over max, the KV utilisation the Gateway API Inference Extension's picker reads)
``nv_trt_llm_request_metrics{request_type=active|max|scheduled|context|waiting}``
``nv_trt_llm_general_metrics{general_type=iteration_counter|num_preemptions|prefix_cache_queries|prefix_cache_hits}``

Speculative decoding, as counters (vLLM's names with a ``triton_llm_`` prefix):
``triton_llm_spec_decode_num_drafts_total``, ``triton_llm_spec_decode_num_draft_tokens_total``,
``triton_llm_spec_decode_num_accepted_tokens_total``,
``triton_llm_spec_decode_num_accepted_tokens_per_pos_total{position="0".."k-1"}``, and
``triton_llm_spec_decode_num_standby_steps_total`` (decode rounds for which the draft-length policy drafted nothing,
backend/spec_decode/policy.py).

The engine loop thread's time (backend/engine/loop_clock.py), a counter of seconds per state:
``triton_llm_engine_loop_seconds_total{state=busy|cpu|runqueue|blocked}`` (busy: inside steps; cpu: on a
core; runqueue: waiting for a core; blocked: asleep inside steps, mostly waiting for the GIL). The share of
``blocked`` in ``busy`` is what other Python threads cost the steps.

The inter-token latency, a histogram (``triton_llm_inter_token_latency_seconds``, vLLM's buckets): the gaps
``DecodeGaps`` (backend/serving/decode_gaps.py) recorded, one per decode step, observed at each update.

LoRA gauges: backend/serving/lora_metrics.py. What serves requests, as an info gauge (always 1; ``ServedFormats``):
``triton_llm_model_info{quantization="int8",kv_cache_dtype="int8",dtype="float32"} 1``.

A small thread reads ``engine.stats()`` every ``interval_s`` and sets the gauges through Triton's
custom metrics API (``pb_utils.MetricFamily``), passed in so the module is testable without a server.
``close()`` releases the metrics and then their families: the model's ``finalize()`` calls it, because a
family still alive at interpreter teardown clears its metrics through the stub's shared memory after the
stub has released it (a segfault in ``Metric::Clear()`` on every shutdown).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from backend.serving.lora_metrics import LoraMetrics
from backend.serving.request_metrics import PREFIX, TOKEN_LATENCY_BUCKETS

log = logging.getLogger(__name__)

KV_FAMILY = "nv_trt_llm_kv_cache_block_metrics"
REQUEST_FAMILY = "nv_trt_llm_request_metrics"
GENERAL_FAMILY = "nv_trt_llm_general_metrics"
MODEL_INFO_FAMILY = "triton_llm_model_info"
SPEC_PREFIX = "triton_llm_spec_decode_"
SPEC_COUNTERS: dict[str, Callable[[Any], int]] = {     # family suffix -> cumulative value in EngineStats.spec
    "num_drafts_total": lambda c: c.num_drafts,
    "num_draft_tokens_total": lambda c: c.num_draft_tokens,
    "num_accepted_tokens_total": lambda c: c.num_accepted_tokens,
    "num_standby_steps_total": lambda c: c.num_standby_steps,
}
SPEC_PER_POS = SPEC_PREFIX + "num_accepted_tokens_per_pos_total"
LOOP_FAMILY = "triton_llm_engine_loop_seconds_total"
LOOP_COUNTERS: dict[str, Callable[[Any], float | None]] = {   # state -> seconds in EngineStats.loop (a LoopTime)
    "busy": lambda t: t.busy_s,
    "cpu": lambda t: t.cpu_s,
    "runqueue": lambda t: t.runqueue_s,
    "blocked": lambda t: t.blocked_s,
}
ITL_FAMILY = PREFIX + "inter_token_latency_seconds"


def used_fraction(used: int, total: int) -> float:
    """``used / total`` blocks, 0.0 for an empty cache (no blocks at all)."""
    return used / total if total > 0 else 0.0


# label value -> how to read it from the engine's stats (and from constants such as max_num_seqs)
KV_GAUGES: dict[str, Callable[[Any], float]] = {
    "max": lambda s: s.kv_blocks_max,
    "free": lambda s: s.kv_blocks_free,
    "used": lambda s: s.kv_blocks_used,
    "tokens_per": lambda s: s.tokens_per_block,
    "reused": lambda s: s.kv_blocks_reused,
    "fraction": lambda s: used_fraction(s.kv_blocks_used, s.kv_blocks_max),
}
REQUEST_GAUGES: dict[str, Callable[[Any], float]] = {
    "active": lambda s: s.num_running + s.num_waiting,
    "scheduled": lambda s: s.num_scheduled,
    "context": lambda s: s.num_prefilling,   # sequences still computing their prompt (chunked prefill)
    "waiting": lambda s: s.num_waiting,
}
GENERAL_GAUGES: dict[str, Callable[[Any], float]] = {
    "iteration_counter": lambda s: s.steps,
    "num_preemptions": lambda s: s.num_preemptions,
    "prefix_cache_queries": lambda s: s.prefix_cache_queries,
    "prefix_cache_hits": lambda s: s.prefix_cache_hits,
}


class _Counters:
    """Cumulative engine figures published as counters, which only go up: each update adds what grew since the
    last (a figure the source does not report, None, stays where it is)."""

    def __init__(self, metrics: list[tuple[Any, Callable[[Any], float | None]]]):
        self.metrics = metrics
        self._seen = [0] * len(metrics)

    def update(self, source) -> None:
        for i, (metric, read) in enumerate(self.metrics):
            now = read(source)
            if now is not None and now > self._seen[i]:
                metric.increment(float(now - self._seen[i]))
                self._seen[i] = now


class EngineMetrics:
    """Publishes ``stats_fn()`` as gauges; ``update()`` once, or ``start()`` a periodic thread."""

    def __init__(self, pb_utils, stats_fn: Callable[[], Any], *, max_num_seqs: int, model: str = "llm",
                 version: str = "1", interval_s: float = 1.0, model_info: Mapping[str, str] | None = None,
                 decode_gaps: Callable[[], list[float]] | None = None, lora=None):
        """``model_info``: the labels of ``triton_llm_model_info`` (the formats serving requests), or None.
        ``decode_gaps``: returns the inter-token gaps (seconds) recorded since its last call (``DecodeGaps.drain``).
        ``lora``: the engine's ``LoraRuntime`` when it serves adapters (``lora_metrics.py``'s gauges), or None."""
        self._stats_fn = stats_fn
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pb, self._base = pb_utils, {"model": model, "version": str(version)}
        self._families: list[Any] = []         # every family, released after every metric by close()
        self._gauges = self._engine_gauges(max_num_seqs)
        self._info = self._model_info(model_info)
        counter = pb_utils.MetricFamily.COUNTER
        spec = [self._family(SPEC_PREFIX + name, counter, f"Speculative decoding: {name.replace('_', ' ')}")
                for name in SPEC_COUNTERS]
        self._spec = _Counters([(family.Metric(labels=self._base), read)
                                for family, read in zip(spec, SPEC_COUNTERS.values())])
        self._per_pos_family = self._family(SPEC_PER_POS, counter, "Speculative decoding: drafts accepted at each "
                                                                   "position (0 = the first draft)")
        self._per_pos: list[Any] = []
        self._per_pos_seen: list[int] = []
        loop = self._family(LOOP_FAMILY, counter, "Seconds of the engine loop thread: busy (in steps) = cpu + "
                                                  "runqueue + blocked (GIL, locks)")
        self._loop = _Counters([(loop.Metric(labels={**self._base, "state": state}), read)
                                for state, read in LOOP_COUNTERS.items()])
        self._gaps = decode_gaps
        self._itl = self._family(
            ITL_FAMILY, pb_utils.MetricFamily.HISTOGRAM,
            "Time between consecutive token steps of a sequence (one observation per decode step)",
        ).Metric(labels=self._base, buckets=TOKEN_LATENCY_BUCKETS)
        self._lora = LoraMetrics(pb_utils, lora.stats, lora.names, self._base) if lora is not None else None
        self._closed = False

    def _family(self, name: str, kind, description: str):
        """A new metric family, kept for ``close()``."""
        family = self._pb.MetricFamily(name=name, description=description, kind=kind)
        self._families.append(family)
        return family

    def _engine_gauges(self, max_num_seqs: int) -> list[tuple[Any, Callable[[Any], float]]]:
        """TensorRT-LLM's three gauge families, a gauge per label and how to read it; ``max`` requests is constant."""
        gauge, base = self._pb.MetricFamily.GAUGE, self._base
        gauges: list[tuple[Any, Callable[[Any], float]]] = []
        for name, description, label, reads in (
                (KV_FAMILY, "KV cache block counts of the paged cache", "kv_cache_block_type", KV_GAUGES),
                (REQUEST_FAMILY, "Request counts of the engine's scheduler", "request_type", REQUEST_GAUGES),
                (GENERAL_FAMILY, "General engine counters", "general_type", GENERAL_GAUGES)):
            family = self._family(name, gauge, description)
            gauges += [(family.Metric(labels={**base, label: value}), read) for value, read in reads.items()]
            if name == REQUEST_FAMILY:
                requests = family
        # keep a reference: metrics die with it
        self._max_seqs = requests.Metric(labels={**base, "request_type": "max"})
        self._max_seqs.set(float(max_num_seqs))
        return gauges

    def _model_info(self, model_info: Mapping[str, str] | None):
        """The info gauge (always 1) labelled with what serves requests; None without ``model_info``."""
        if model_info is None:
            return None
        family = self._family(MODEL_INFO_FAMILY, self._pb.MetricFamily.GAUGE,
                              "What serves requests: weight quantization, KV cache dtype, compute dtype (always 1)")
        info = family.Metric(labels={**self._base, **model_info})
        info.set(1.0)
        return info

    def update(self) -> None:
        if self._closed:
            return
        stats = self._stats_fn()
        for metric, read in self._gauges:
            metric.set(float(read(stats)))
        self._spec.update(stats.spec)
        self._update_per_pos(stats.spec.accepted_per_pos)
        if stats.loop is not None:
            self._loop.update(stats.loop)
        if self._lora is not None:
            self._lora.update()
        if self._gaps is not None:
            observe = self._itl.observe
            for gap in self._gaps():
                observe(gap)

    def _update_per_pos(self, accepted_per_pos: list[int]) -> None:
        """Drafts accepted per position: a counter per position, added as the engine's speculation reaches it."""
        for pos, now in enumerate(accepted_per_pos):
            while len(self._per_pos) <= pos:
                self._per_pos.append(self._per_pos_family.Metric(labels={**self._base,
                                                                         "position": str(len(self._per_pos))}))
                self._per_pos_seen.append(0)
            if now > self._per_pos_seen[pos]:
                self._per_pos[pos].increment(float(now - self._per_pos_seen[pos]))
                self._per_pos_seen[pos] = now

    def start(self) -> "EngineMetrics":
        self.update()
        self._thread = threading.Thread(target=self._run, name="llm-metrics", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.update()
            except Exception:  # metrics must never take the model down
                log.exception("metrics update failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def close(self) -> None:
        """Stop publishing; release every metric, then every family (nothing is published afterwards)."""
        self.stop()
        self._closed = True
        self._gauges, self._per_pos = [], []
        self._spec.metrics, self._loop.metrics = [], []
        self._max_seqs = self._info = self._itl = self._per_pos_family = None
        if self._lora is not None:
            self._lora.close()
            self._lora = None
        self._families = []
