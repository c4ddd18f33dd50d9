"""LoRA gauges: requests running and waiting per adapter, and vLLM's ``lora_requests_info`` shape.

``triton_llm_lora_requests{lora_name="a",state="running|waiting"}``: sequences of each served adapter.
``triton_llm_lora_requests_info{running_lora_adapters="a,b",waiting_lora_adapters="c",max_lora="4"}``: shaped as
``vllm:lora_requests_info`` (the value is the time of the last update, in seconds since the epoch; one label set
at a time: a changed set replaces the previous one), what the Gateway API Inference Extension's endpoint picker
reads for adapter affinity (docs/lora.md has its ``engineConfigs`` entry). Updated by ``EngineMetrics``.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

LORA_REQUESTS_FAMILY = "triton_llm_lora_requests"
LORA_INFO_FAMILY = "triton_llm_lora_requests_info"


class LoraMetrics:
    def __init__(self, pb_utils, stats_fn: Callable[[], Any], names: list[str], base: dict[str, str]):
        """``stats_fn`` returns a ``LoraStats`` (backend/lora/runtime.py); ``names``: every served adapter."""
        gauge = pb_utils.MetricFamily.GAUGE
        self._stats_fn, self._base = stats_fn, base
        self._requests_family = pb_utils.MetricFamily(name=LORA_REQUESTS_FAMILY, kind=gauge,
                                                      description="Sequences running / waiting per LoRA adapter")
        self._info_family = pb_utils.MetricFamily(
            name=LORA_INFO_FAMILY, kind=gauge,
            description="LoRA adapters running and waiting (vLLM's lora_requests_info; value: update time)")
        self._requests = {(name, state): self._requests_family.Metric(
            labels={**base, "lora_name": name, "state": state}) for name in names for state in ("running", "waiting")}
        self._info = None
        self._info_labels: dict[str, str] | None = None

    def update(self) -> None:
        stats = self._stats_fn()
        for (name, state), metric in self._requests.items():
            metric.set(float((stats.running if state == "running" else stats.waiting).get(name, 0)))
        labels = info_labels(stats)
        if labels != self._info_labels:
            self._info = None                       # the previous label set goes first
            self._info = self._info_family.Metric(labels={**self._base, **labels})
            self._info_labels = labels
        self._info.set(time.time())

    def close(self) -> None:
        self._requests, self._info = {}, None
        self._requests_family = self._info_family = None


def info_labels(stats) -> dict[str, str]:
    """vLLM's labels: comma-separated adapter names running and waiting, and ``max_lora``."""
    return {"running_lora_adapters": ",".join(sorted(stats.running)),
            "waiting_lora_adapters": ",".join(sorted(stats.waiting)), "max_lora": str(stats.max_loras)}
