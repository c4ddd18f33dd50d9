"""Per-request latency and token histograms and counters on Triton's metrics port.

Named after vLLM's (``vllm:`` becomes ``triton_llm_``) with vLLM's bucket boundaries, so dashboards
and alerts carry over. Observed once per finished request through Triton's custom metrics API
(``pb_utils.MetricFamily``, passed in so this is testable without a server). Each ``observe`` /
``increment`` is a round trip to the server process (~20 us of CPU), so ``RequestMetrics.record`` runs
on the llm model's telemetry thread, never on the engine loop. The inter-token latency, a value per decode
step rather than per request, is observed by ``EngineMetrics`` (backend/serving/decode_gaps.py).

Labels: ``model``, ``version`` (and ``finish_reason`` on ``triton_llm_request_success_total``).
"""
from __future__ import annotations

from typing import Any

from backend.core.outputs import RequestStats

PREFIX = "triton_llm_"

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0]
TOKEN_LATENCY_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                         20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0]
FINISH_REASONS = ("stop", "length", "abort", "error")


def build_1_2_5_buckets(max_value: int) -> list[float]:
    """``[1, 2, 5, 10, 20, 50, ...]`` up to ``max_value`` (vLLM's token-count buckets)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return [float(b) for b in out]
            out.append(m * scale)
        scale *= 10


# name (without prefix) -> (description, buckets or None for a counter)
TIME_HISTOGRAMS = {
    "time_to_first_token_seconds": ("Time from arrival at the engine to the first generated token", TTFT_BUCKETS),
    "time_per_output_token_seconds": ("Mean inter-token time of a request with at least 2 output tokens "
                                      "(decode time / (output tokens - 1))", TOKEN_LATENCY_BUCKETS),
    "e2e_request_latency_seconds": ("Time from arrival at the engine to the request's end",
                                    REQUEST_LATENCY_BUCKETS),
    "request_queue_time_seconds": ("Time from arrival at the engine to first scheduling", REQUEST_LATENCY_BUCKETS),
}
TOKEN_HISTOGRAMS = {
    "request_prompt_tokens": "Prompt tokens of a finished request",
    "request_generation_tokens": "Generated tokens of a finished request (all its sequences)",
}
COUNTERS = {
    "prompt_tokens_total": "Prompt tokens of finished requests",
    "generation_tokens_total": "Generated tokens of finished requests",
}
SUCCESS_COUNTER = "request_success_total"


class RequestMetrics:
    """Histogram and counter families; ``record(stats, finish_reason)`` once per finished request."""

    def __init__(self, pb_utils, *, max_model_len: int, model: str = "llm", version: str = "1"):
        labels = {"model": model, "version": str(version)}
        kinds = pb_utils.MetricFamily
        self._families: list[Any] = []   # Triton drops a family's metrics when the family object dies
        self._hist: dict[str, Any] = {}
        self._count: dict[str, Any] = {}

        def family(name, description, kind):
            fam = pb_utils.MetricFamily(name=PREFIX + name, description=description, kind=kind)
            self._families.append(fam)
            return fam

        for name, (description, buckets) in TIME_HISTOGRAMS.items():
            self._hist[name] = family(name, description, kinds.HISTOGRAM).Metric(labels=labels, buckets=buckets)
        token_buckets = build_1_2_5_buckets(max(1, max_model_len))
        for name, description in TOKEN_HISTOGRAMS.items():
            self._hist[name] = family(name, description, kinds.HISTOGRAM).Metric(labels=labels,
                                                                                  buckets=token_buckets)
        for name, description in COUNTERS.items():
            self._count[name] = family(name, description, kinds.COUNTER).Metric(labels=labels)
        success = family(SUCCESS_COUNTER, "Finished requests by finish reason", kinds.COUNTER)
        self._success = {r: success.Metric(labels={**labels, "finish_reason": r}) for r in FINISH_REASONS}

    def record(self, stats: RequestStats | None, finish_reason: str) -> None:
        """One finished request. ``stats`` is None for a request the engine never queued (an error)."""
        success = self._success.get(finish_reason) or self._success.get("error")
        if success is None:   # closed
            return
        success.increment(1)
        if stats is None:
            return
        h, c = self._hist, self._count
        c["prompt_tokens_total"].increment(stats.num_prompt_tokens)
        if stats.num_output_tokens:
            c["generation_tokens_total"].increment(stats.num_output_tokens)
        h["request_prompt_tokens"].observe(stats.num_prompt_tokens)
        h["request_generation_tokens"].observe(stats.num_output_tokens)
        h["e2e_request_latency_seconds"].observe(stats.e2e_latency)
        if stats.queue_time is not None:
            h["request_queue_time_seconds"].observe(stats.queue_time)
        if stats.time_to_first_token is not None:
            h["time_to_first_token_seconds"].observe(stats.time_to_first_token)
        if stats.time_per_output_token is not None:
            h["time_per_output_token_seconds"].observe(stats.time_per_output_token)

    def close(self) -> None:
        """Release the metrics, then their families (the llm model's finalize, through the telemetry's closers)."""
        self._hist, self._count, self._success = {}, {}, {}
        self._families = []
