"""The ports of ``make serve``: tritonserver's three and the gateway's two, each its own.

tritonserver listens on ``HTTP_PORT`` (8000), ``GRPC_PORT`` (8001) and ``METRICS_PORT`` (8002) on every
interface (``cli.launcher.Ports``); the gateway on ``GATEWAY_LISTEN`` (else ``0.0.0.0:$GATEWAY_PORT``, 50051)
for the typed gRPC API and ``OPENAI_LISTEN`` (else ``0.0.0.0:$OPENAI_PORT``, 9000; ``off``: none) for the
OpenAI-compatible HTTP API. Two of them on one port number would leave one server failing with "address already
in use" after the other started, so ``check_distinct`` refuses that before anything starts, naming both variables.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from cli.launcher import LauncherError, Ports


@dataclass(frozen=True)
class Listen:
    """One gateway address: ``host:port``, and the variable it came from (for messages)."""

    host: str
    port: int
    variable: str

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class GatewayListen:
    grpc: Listen
    openai: Listen | None       # None: the OpenAI-compatible API is off


def _port(raw: str, variable: str) -> int:
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise LauncherError(f"{variable}: expected a port number (1-65535), got {raw!r}")
    return int(raw)


def _listen(env: Mapping[str, str], listen_var: str, port_var: str, default_port: str) -> Listen:
    raw = env.get(listen_var, "").strip()
    if raw:
        host, sep, port = raw.rpartition(":")
        if not sep or not host:
            raise LauncherError(f"{listen_var}: expected HOST:PORT, got {raw!r}")
        return Listen(host, _port(port, listen_var), listen_var)
    return Listen("0.0.0.0", _port(env.get(port_var, "").strip() or default_port, port_var), port_var)


def gateway_listen_from_env(env: Mapping[str, str]) -> GatewayListen:
    """The gateway's addresses as the environment asks (the same variables ``python -m gateway`` reads)."""
    grpc = _listen(env, "GATEWAY_LISTEN", "GATEWAY_PORT", "50051")
    off = env.get("OPENAI_LISTEN", "").strip().lower() == "off"
    return GatewayListen(grpc, None if off else _listen(env, "OPENAI_LISTEN", "OPENAI_PORT", "9000"))


def check_distinct(triton: Ports, gateway: GatewayListen | None) -> None:
    """Raise ``LauncherError`` naming both variables when two servers would share a port number."""
    taken: dict[int, str] = {}
    named = [(triton.http, "HTTP_PORT"), (triton.grpc, "GRPC_PORT"), (triton.metrics, "METRICS_PORT")]
    if gateway is not None:
        named += [(listen.port, listen.variable) for listen in (gateway.grpc, gateway.openai) if listen is not None]
    used = {port for port, _ in named}
    for port, variable in named:
        if port in taken:
            raise LauncherError(f"{taken[port]} and {variable} are both {port}: each server needs a port of its own "
                                f"(set {variable} to another, e.g. {variable}={unused_above(port, used)})")
        taken[port] = variable


def unused_above(port: int, used: set[int]) -> int:
    """The first port number above ``port`` not in ``used`` (a suggestion for the message, not checked free)."""
    candidate = port + 1
    while candidate in used:
        candidate += 1
    return candidate if candidate < 65536 else 1024
