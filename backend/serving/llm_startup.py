"""The ``llm`` model's start: ``config.pbtxt``'s parameters split between the engine and serving, the engine
built and started, its metrics, the request telemetry, the load line, the watchdog (``build_llm_serving``)."""
from __future__ import annotations

import logging
import os

from backend.config import SETTING_GROUPS, EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.serving.decode_gaps import DecodeGaps
from backend.serving.llm_serving import LLMServing
from backend.serving.metrics import EngineMetrics
from backend.serving.request_log import RequestLog
from backend.serving.request_metrics import RequestMetrics
from backend.serving.telemetry import FinishedRequest, RequestTelemetry
from contracts.triton_config import check_known_parameters, model_parameters, positive_float_param, resolve_paths
from tracing import ModelTracer

log = logging.getLogger(__name__)

# config.pbtxt parameters read by serving (the others go to EngineConfig.from_parameters).
SERVING_PARAMETERS = {"cancel_poll_interval_s": "0.2", "metrics_interval_s": "1.0", "request_log_level": "info",
                      "engine_stall_timeout_s": "30", "engine_unhealthy_action": "shutdown"}
# every parameter the llm model reads; any other fails its load (check_known_parameters)
LLM_PARAMETERS = frozenset(SETTING_GROUPS) | frozenset(SERVING_PARAMETERS)


def split_parameters(params: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(engine parameters, serving parameters with defaults)."""
    serving = {k: params.get(k) or d for k, d in SERVING_PARAMETERS.items()}
    engine = {k: v for k, v in params.items() if k not in SERVING_PARAMETERS}
    return engine, serving


def build_llm_serving(model_config: dict, pb_utils, *, model_version: str = "1") -> LLMServing:
    """Build the engine from the model's parameters, start it, publish its metrics, watch it. A parameter
    the model does not read fails the load, naming it and the model."""
    params = model_parameters(model_config)
    check_known_parameters(model_config.get("name", "llm"), params, LLM_PARAMETERS)
    engine_params, serving = split_parameters(resolve_paths(params))
    poll = positive_float_param(serving, "cancel_poll_interval_s", 0.2)
    interval = positive_float_param(serving, "metrics_interval_s", 1.0)
    engine = LLMEngine(EngineConfig.from_parameters(engine_params))
    if engine.structured is not None:
        engine.structured.compiles.warm_up()    # the grammar layer at load time, not on the first guided request
    gaps = DecodeGaps()                # the inter-token latency, one value per decode step (after the timeline's)
    engine.observers.observers.append(gaps)
    engine.start()
    name = model_config.get("name", "llm")
    formats = engine.parts.formats.labels()     # weight / KV / compute formats: /metrics and the log line
    metrics = EngineMetrics(pb_utils, engine.stats, max_num_seqs=engine.config.scheduler.max_num_seqs,
                            model=name, version=model_version, interval_s=interval, model_info=formats,
                            decode_gaps=gaps.drain, lora=engine.lora).start()
    telemetry, tracer = build_telemetry(pb_utils, max_model_len=engine.scheduler.max_model_len, model=name,
                                        version=model_version, log_level=serving["request_log_level"],
                                        formats=formats)
    log_load_summary(pb_utils, getattr(engine.parts, "summary", ""))
    llm = LLMServing(engine, pb_utils, cancel_poll_interval_s=poll, metrics=metrics, telemetry=telemetry,
                     tracing=tracer is not None,
                     model_name=os.path.basename(os.path.normpath(engine.config.model.model_path)),
                     queue_cap=(engine.config.scheduler.max_num_seqs, engine.config.scheduler.max_queued_requests))
    llm.watch(positive_float_param(serving, "engine_stall_timeout_s", 30.0), serving["engine_unhealthy_action"])
    return llm


def build_telemetry(pb_utils, *, max_model_len: int, model: str, version: str, log_level: str = "info",
                    formats: dict[str, str] | None = None) -> tuple[RequestTelemetry, ModelTracer | None]:
    """(RequestTelemetry started, ModelTracer or None): histograms, the request log, and spans when the
    OTEL_* environment turns tracing on. Its shutdown flushes the tracer and releases the histograms."""
    metrics = RequestMetrics(pb_utils, max_model_len=max_model_len, model=model, version=version)
    request_log = RequestLog(log_level, formats=formats)

    def record_metrics(rec: FinishedRequest) -> None:
        metrics.record(rec.stats, rec.finish_reason)
    sinks = [record_metrics, request_log.write]
    tracer = ModelTracer.from_env(model)
    if tracer is not None:
        from backend.serving.tracing import LLMSpans

        sinks.append(LLMSpans(tracer))
    closers = ([tracer.shutdown] if tracer is not None else []) + [metrics.close]
    # the metric families live as long as the telemetry that observes them (until metrics.close)
    telemetry = RequestTelemetry(sinks, closers=closers, resources=(metrics, request_log, tracer)).start()
    return telemetry, tracer


def log_load_summary(pb_utils, summary: str) -> None:
    """The engine's one load line (backend/engine/builder.py), in Triton's log when it has a logger."""
    if not summary:
        return
    logger = getattr(pb_utils, "Logger", None)
    if logger is not None:
        logger.log_info(summary)
    else:
        log.warning(summary)
