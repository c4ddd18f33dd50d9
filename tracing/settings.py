"""OTLP tracing settings from the standard ``OTEL_*`` environment, and tritonserver's flags for them."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

DEFAULT_SERVICE_NAME = "triton-llm"
TRACES_PATH = "/v1/traces"
# The batch delay ``make serve`` gives every exporter when traces go to this machine (the trace viewer, a local
# Jaeger) and OTEL_BSP_SCHEDULE_DELAY is unset (cli/serve.py); the trace viewer's quiet period follows it.
LOCAL_SCHEDULE_DELAY_MS = 1000
SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
            "parentbased_traceidratio")




class TracingConfigError(ValueError):
    """An OTEL_* variable this deployment cannot honour (the message names it)."""


@dataclass(frozen=True)
class TracingSettings:
    traces_url: str                       # the OTLP/HTTP traces URL (…/v1/traces)
    service_name: str = DEFAULT_SERVICE_NAME
    resource_attributes: tuple[tuple[str, str], ...] = ()
    sampler: str = "parentbased_always_on"
    ratio: float = 1.0                    # share of requests traced (from the sampler)
    max_queue_size: int = 2048            # spans buffered per process (OTEL_BSP_MAX_QUEUE_SIZE); more are dropped
    max_export_batch_size: int = 512      # OTEL_BSP_MAX_EXPORT_BATCH_SIZE: a full batch is exported at once
    schedule_delay_ms: int = 5000         # OTEL_BSP_SCHEDULE_DELAY (the spec's default): the longest a span waits
    export_timeout_s: float = 3.0         # one export, retries included

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "TracingSettings | None":
        """The settings the environment asks for, or None when tracing is off. Raises
        ``TracingConfigError`` naming the variable when a value cannot be honoured."""
        env = os.environ if env is None else env
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return None
        exporter = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
        if exporter == "none":
            return None
        if exporter != "otlp":
            raise TracingConfigError(f"OTEL_TRACES_EXPORTER: only 'otlp' (or 'none') is supported, got {exporter!r}")
        url = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        if not url:
            base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
            if not base:
                return None
            url = base.rstrip("/") + TRACES_PATH
        if not url.startswith(("http://", "https://")):
            raise TracingConfigError(f"OTEL_EXPORTER_OTLP_ENDPOINT: expected an http(s):// URL, got {url!r}")
        for var in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
            protocol = env.get(var, "").strip().lower()
            if protocol and protocol != "http/protobuf" and protocol != "http/json":
                raise TracingConfigError(f"{var}: tritonserver exports OTLP over HTTP only, got {protocol!r}")
            if protocol:
                break
        sampler, ratio = parse_sampler(env.get("OTEL_TRACES_SAMPLER", ""), env.get("OTEL_TRACES_SAMPLER_ARG", ""))
        service = env.get("OTEL_SERVICE_NAME", "").strip() or DEFAULT_SERVICE_NAME
        resource = parse_resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES", ""))
        timeout = env.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or env.get("OTEL_EXPORTER_OTLP_TIMEOUT")
        kwargs: dict[str, Any] = {}
        if timeout:
            try:
                kwargs["export_timeout_s"] = float(timeout) / 1000.0   # the spec's unit: milliseconds
            except ValueError:
                raise TracingConfigError(f"OTEL_EXPORTER_OTLP_TIMEOUT: expected milliseconds, got {timeout!r}") from None
        for var, name in (("OTEL_BSP_MAX_QUEUE_SIZE", "max_queue_size"),
                          ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "max_export_batch_size"),
                          ("OTEL_BSP_SCHEDULE_DELAY", "schedule_delay_ms")):
            raw = env.get(var, "").strip()
            if raw:
                try:
                    kwargs[name] = int(raw)
                except ValueError:
                    raise TracingConfigError(f"{var}: expected a whole number, got {raw!r}") from None
                if kwargs[name] <= 0:
                    raise TracingConfigError(f"{var}: must be > 0, got {raw!r}")
        queue_size = kwargs.get("max_queue_size", cls.max_queue_size)
        batch_size = kwargs.get("max_export_batch_size", cls.max_export_batch_size)
        if batch_size > queue_size:
            raise TracingConfigError(f"OTEL_BSP_MAX_EXPORT_BATCH_SIZE: {batch_size} is more than the queue "
                                     f"(OTEL_BSP_MAX_QUEUE_SIZE {queue_size})")
        return cls(url, service, resource, sampler, ratio, **kwargs)

    @property
    def triton_rate(self) -> int | None:
        """tritonserver's ``rate`` (trace one request in N), or None when nothing is sampled."""
        if self.ratio <= 0.0:
            return None
        return max(1, round(1.0 / self.ratio))

    def triton_args(self) -> list[str]:
        """tritonserver flags for its OpenTelemetry mode. With the sampler off the mode is still set,
        at level OFF, so tracing can be turned on at run time (``POST /v2/trace/setting``)."""
        rate = self.triton_rate
        args = ["mode=opentelemetry", f"opentelemetry,url={self.traces_url}",
                f"level={'TIMESTAMPS' if rate else 'OFF'}", f"rate={rate or 1}", "count=-1",
                f"opentelemetry,resource=service.name={self.service_name}",
                f"opentelemetry,bsp_max_queue_size={self.max_queue_size}",
                f"opentelemetry,bsp_max_export_batch_size={self.max_export_batch_size}",
                f"opentelemetry,bsp_schedule_delay={self.schedule_delay_ms}"]
        args += [f"opentelemetry,resource={k}={v}" for k, v in self.resource_attributes if k != "service.name"]
        return [a for arg in args for a in ("--trace-config", arg)]


def parse_sampler(name: str, arg: str) -> tuple[str, float]:
    """``(sampler, ratio)`` from OTEL_TRACES_SAMPLER / _ARG (the spec's default: parentbased_always_on)."""
    name = (name or "parentbased_always_on").strip().lower()
    if name not in SAMPLERS:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER: expected one of {', '.join(SAMPLERS)}, got {name!r}")
    if name.endswith("always_on"):
        return name, 1.0
    if name.endswith("always_off"):
        return name, 0.0
    try:
        ratio = float(arg) if arg.strip() else 1.0
    except ValueError:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER_ARG: expected a ratio in [0, 1], got {arg!r}") from None
    if not 0.0 <= ratio <= 1.0:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER_ARG: expected a ratio in [0, 1], got {arg!r}")
    return name, ratio


def parse_resource_attributes(raw: str) -> tuple[tuple[str, str], ...]:
    """``"k1=v1,k2=v2"`` (OTEL_RESOURCE_ATTRIBUTES) as pairs; malformed items are skipped."""
    pairs = []
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            pairs.append((key.strip(), value.strip()))
    return tuple(pairs)
