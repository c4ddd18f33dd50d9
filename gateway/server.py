"""The gateway's gRPC server: LLMService, grpc.health.v1 and server reflection on one port.

Health (service ``""`` and ``triton_llm.v1.LLMService``) is SERVING only while Triton's ensemble is
ready (polled every ``health_interval_s``), and NOT_SERVING from the moment shutdown starts. On
SIGTERM or SIGINT the server stops taking calls, lets in-flight streams finish for
``grace_period_s``, then cancels them (which cancels their Triton requests).
"""
from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from triton_llm.v1 import llm_service_pb2 as pb
from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc

from .config import GatewayConfig, TokenSet
from .openai import HTTPServer, create_app
from .service import LLMService
from .tracing import GatewayTracing
from .upstream import TritonUpstream

log = logging.getLogger("gateway")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["LLMService"].full_name  # triton_llm.v1.LLMService
SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),  # a second gateway on the same port fails instead of sharing it
    ("grpc.max_send_message_length", 16 * 2**20),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
]


@dataclass
class Gateway:
    config: GatewayConfig
    server: grpc.aio.Server
    upstream: TritonUpstream
    service: LLMService
    health: health.aio.HealthServicer
    port: int
    http: HTTPServer | None = None      # the OpenAI-compatible API (gateway/openai/), when openai_listen is set

    async def set_serving(self, ready: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def stop(self, grace: float | None = None) -> None:
        """Stop taking calls (health NOT_SERVING), wait up to ``grace`` for in-flight calls, cancel the rest."""
        grace = self.config.grace_period_s if grace is None else grace
        await self.health.enter_graceful_shutdown()
        log.info("shutting down: %d Generate call(s) in flight, grace period %.0fs", self.service.inflight, grace)
        if self.http is not None:
            await asyncio.gather(self.server.stop(grace), self.http.stop(grace))
        else:
            await self.server.stop(grace)
        await self.upstream.close()
        if self.service.tracing is not None:   # flush the last spans (bounded: a hanging collector is left behind)
            await asyncio.to_thread(self.service.tracing.shutdown)


def _credentials(config: GatewayConfig) -> grpc.ServerCredentials | None:
    if not config.tls:
        return None
    return grpc.ssl_server_credentials([(config.tls_key.read_bytes(), config.tls_cert.read_bytes())])


async def start(config: GatewayConfig, *, span_exporter=None) -> Gateway:
    """Build and start the server (the caller runs the event loop); raises if the port cannot be bound.
    ``span_exporter`` replaces the OTLP exporter of the server spans (tests)."""
    upstream = TritonUpstream(config.triton_url, config.triton_model, poll_interval_s=config.health_interval_s,
                              roots=config.roots, tokenizer_path=config.tokenizer_path)
    tokens = TokenSet(config.auth_tokens, config.auth_token_file)
    tracing = GatewayTracing.from_settings(config.tracing, span_exporter)
    service = LLMService(upstream, tokens=tokens, max_inflight=config.max_inflight, tracing=tracing,
                         stream_buffer_bytes=config.stream_buffer_bytes)
    # a larger message ends with RESOURCE_EXHAUSTED before any handler runs
    server = grpc.aio.server(options=[*SERVER_OPTIONS, ("grpc.max_receive_message_length", config.max_request_bytes)])
    pb_grpc.add_LLMServiceServicer_to_server(service, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    creds = _credentials(config)
    port = server.add_secure_port(config.listen, creds) if creds else server.add_insecure_port(config.listen)
    gw = Gateway(config, server, upstream, service, health_servicer, port)
    await gw.set_serving(False)
    upstream.on_readiness_change(gw.set_serving)
    if tracing is not None:   # the served checkpoint's name for gen_ai.request.model, read once per readiness period
        async def read_facts(ready: bool) -> None:
            if ready:
                try:
                    await upstream.facts()
                except grpc.aio.AioRpcError:
                    pass   # read again by the next call that needs them
        upstream.on_readiness_change(read_facts)
    await upstream.poll_once()
    upstream.start()
    await server.start()
    if config.openai_listen is not None:
        app = create_app(service, config.triton_metrics_url, config.max_request_bytes)
        gw.http = HTTPServer(app, config.openai_listen,
                             log_level=config.log_level if config.log_level.upper() == "DEBUG" else "warning",
                             grace_s=config.grace_period_s,
                             tls_cert=str(config.tls_cert) if config.tls else None,
                             tls_key=str(config.tls_key) if config.tls else None)
        try:
            await gw.http.start()
        except RuntimeError:
            await server.stop(0)
            await upstream.close()
            raise
        log.info("OpenAI-compatible API on %s (port %d)", config.openai_listen, gw.http.port)
    log.info("gateway listening on %s (port %d, %s, auth %s, tracing %s) -> Triton %s model %r (%s)", config.listen,
             port, "TLS" if creds else "plaintext", "on" if tokens.enabled else "off",
             f"to {config.tracing.traces_url}" if tracing is not None else "off", config.triton_url,
             config.triton_model, "ready" if upstream.ready else "not ready yet")
    return gw


async def serve(config: GatewayConfig) -> None:
    """Run until SIGTERM / SIGINT, then shut down gracefully."""
    gw = await start(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await gw.stop()
    log.info("gateway stopped")
