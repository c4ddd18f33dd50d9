"""Gateway settings: command-line flags, each with an environment-variable fallback.

| flag | environment | default |
| --- | --- | --- |
| ``--listen HOST:PORT`` | ``GATEWAY_LISTEN`` (else ``0.0.0.0:$GATEWAY_PORT``) | ``0.0.0.0:50051`` |
| ``--triton-url HOST:PORT`` | ``GATEWAY_TRITON_URL`` (else ``localhost:$GRPC_PORT``) | ``localhost:8001`` |
| ``--triton-model NAME`` | ``GATEWAY_TRITON_MODEL`` | ``ensemble`` |
| ``--auth-token-file PATH`` | ``GATEWAY_AUTH_TOKEN_FILE`` | none |
| (tokens themselves) | ``GATEWAY_AUTH_TOKENS`` (comma-separated) | none |
| ``--tls-cert PATH`` / ``--tls-key PATH`` | ``GATEWAY_TLS_CERT`` / ``GATEWAY_TLS_KEY`` | none (plaintext) |
| ``--max-inflight N`` | ``GATEWAY_MAX_INFLIGHT`` | 256 |
| ``--stream-buffer-bytes N`` | ``GATEWAY_STREAM_BUFFER_BYTES`` | 1048576 (a slow client's waiting output per stream) |
| ``--max-request-bytes N`` | ``GATEWAY_MAX_REQUEST_BYTES`` | 16 MiB (a gRPC message; an HTTP body) |
| ``--grace-period-s S`` | ``GATEWAY_GRACE_PERIOD_S`` | 30 |
| ``--health-interval-s S`` | ``GATEWAY_HEALTH_INTERVAL_S`` | 1.0 |
| ``--tokenizer-path PATH`` | ``GATEWAY_TOKENIZER_PATH`` | the ``preprocess`` model's ``tokenizer_path`` |
| ``--model-root PATH`` | ``GATEWAY_MODEL_ROOT`` | (relative model paths: tried under it, the cwd, the repository) |
| ``--openai-listen HOST:PORT`` | ``OPENAI_LISTEN`` (else ``0.0.0.0:$OPENAI_PORT``) | ``0.0.0.0:9000``; ``off``: no HTTP API |
| ``--triton-metrics-url URL`` | ``GATEWAY_TRITON_METRICS_URL`` (else ``http://localhost:$METRICS_PORT/metrics``) | port 8002 |
| ``--log-level LEVEL`` | ``GATEWAY_LOG_LEVEL`` | ``INFO`` |
| (tracing) | the standard ``OTEL_*`` variables (``tracing/``) | off |

Auth is on when any token is configured (file and/or variable). A flag beats its variable.
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from tracing import TracingConfigError, TracingSettings

REPO = Path(__file__).resolve().parents[1]


class ConfigError(ValueError):
    """A bad flag or environment variable; the message names it."""


@dataclass(frozen=True)
class GatewayConfig:
    listen: str = "0.0.0.0:50051"
    triton_url: str = "localhost:8001"
    triton_model: str = "ensemble"
    auth_token_file: Path | None = None
    auth_tokens: tuple[str, ...] = ()
    tls_cert: Path | None = None
    tls_key: Path | None = None
    max_inflight: int = 256
    stream_buffer_bytes: int = 1 << 20        # output waiting for a slow client, per stream (gateway/stream_buffer.py)
    max_request_bytes: int = 16 * 2**20
    grace_period_s: float = 30.0
    health_interval_s: float = 1.0
    tokenizer_path: Path | None = None
    model_root: Path | None = None
    log_level: str = "INFO"
    openai_listen: str | None = None          # the OpenAI-compatible HTTP API (gateway/openai/); None: off
    triton_metrics_url: str = "http://localhost:8002/metrics"   # served again at the HTTP API's /metrics
    tracing: TracingSettings | None = None   # the server span (gateway/tracing.py); None: off

    def __post_init__(self) -> None:
        if ":" not in self.listen:
            raise ConfigError(f"--listen: expected HOST:PORT, got {self.listen!r}")
        if ":" not in self.triton_url:
            raise ConfigError(f"--triton-url: expected HOST:PORT, got {self.triton_url!r}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key: give both or neither")
        for name in ("tls_cert", "tls_key", "auth_token_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ConfigError(f"--{name.replace('_', '-')}: {path} is not a file")
        if self.openai_listen is not None and ":" not in self.openai_listen:
            raise ConfigError(f"--openai-listen: expected HOST:PORT or off, got {self.openai_listen!r}")
        if not self.triton_metrics_url.startswith(("http://", "https://")):
            raise ConfigError(f"--triton-metrics-url: expected an http(s) URL, got {self.triton_metrics_url!r}")
        if self.max_inflight < 1:
            raise ConfigError(f"--max-inflight: must be >= 1, got {self.max_inflight}")
        if self.stream_buffer_bytes < 1:
            raise ConfigError(f"--stream-buffer-bytes: must be >= 1, got {self.stream_buffer_bytes}")
        if not 1024 <= self.max_request_bytes <= 2**31 - 1:
            raise ConfigError(f"--max-request-bytes: must be in [1024, 2**31 - 1], got {self.max_request_bytes}")
        if self.grace_period_s < 0:
            raise ConfigError(f"--grace-period-s: must be >= 0, got {self.grace_period_s}")
        if self.health_interval_s <= 0:
            raise ConfigError(f"--health-interval-s: must be > 0, got {self.health_interval_s}")

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def roots(self) -> list[Path]:
        """Where relative model paths from Triton's configs are looked up."""
        roots = [self.model_root] if self.model_root else []
        return roots + [Path.cwd(), REPO]


def _env_default(env: Mapping[str, str], name: str, default: str | None) -> str | None:
    value = env.get(name)
    return value if value not in (None, "") else default


@dataclass(frozen=True)
class Flag:
    """One flag and its environment variable: ``default`` may name the port variables make serve shares
    (``{GATEWAY_PORT}``, ``{GRPC_PORT}``, ``{OPENAI_PORT}``, ``{METRICS_PORT}``)."""

    name: str                     # the flag, and (dashes as underscores) the GatewayConfig field it sets
    env: str
    default: str | None
    help: str
    type: type = str

    @property
    def field(self) -> str:
        return self.name[2:].replace("-", "_")


PORT_VARIABLES = {"GATEWAY_PORT": "50051", "GRPC_PORT": "8001", "OPENAI_PORT": "9000", "METRICS_PORT": "8002"}
FLAGS = (
    Flag("--listen", "GATEWAY_LISTEN", "0.0.0.0:{GATEWAY_PORT}",
         "address to serve on, HOST:PORT (env GATEWAY_LISTEN, else 0.0.0.0:$GATEWAY_PORT; default 0.0.0.0:50051)"),
    Flag("--triton-url", "GATEWAY_TRITON_URL", "localhost:{GRPC_PORT}",
         "Triton's gRPC endpoint (env GATEWAY_TRITON_URL, else localhost:$GRPC_PORT; default localhost:8001)"),
    Flag("--triton-model", "GATEWAY_TRITON_MODEL", "ensemble",
         "the model Generate calls (env GATEWAY_TRITON_MODEL; default ensemble)"),
    Flag("--auth-token-file", "GATEWAY_AUTH_TOKEN_FILE", None,
         "file of accepted bearer tokens, one per line (env GATEWAY_AUTH_TOKEN_FILE); "
         "GATEWAY_AUTH_TOKENS adds comma-separated tokens; auth is off when there are none", Path),
    Flag("--tls-cert", "GATEWAY_TLS_CERT", None, "PEM certificate chain for TLS (env GATEWAY_TLS_CERT)", Path),
    Flag("--tls-key", "GATEWAY_TLS_KEY", None, "PEM private key for TLS (env GATEWAY_TLS_KEY)", Path),
    Flag("--max-inflight", "GATEWAY_MAX_INFLIGHT", "256",
         "Generate calls in flight before RESOURCE_EXHAUSTED (env GATEWAY_MAX_INFLIGHT; default 256)", int),
    Flag("--stream-buffer-bytes", "GATEWAY_STREAM_BUFFER_BYTES", str(1 << 20),
         "output that may wait for a slow client, per stream, before its stream ends with "
         "RESOURCE_EXHAUSTED (env GATEWAY_STREAM_BUFFER_BYTES; default 1048576)", int),
    Flag("--max-request-bytes", "GATEWAY_MAX_REQUEST_BYTES", str(16 * 2**20),
         "largest gRPC request message and HTTP request body, in bytes "
         "(env GATEWAY_MAX_REQUEST_BYTES; default 16 MiB)", int),
    Flag("--grace-period-s", "GATEWAY_GRACE_PERIOD_S", "30",
         "on SIGTERM, seconds in-flight calls may finish before they are cancelled "
         "(env GATEWAY_GRACE_PERIOD_S; default 30)", float),
    Flag("--health-interval-s", "GATEWAY_HEALTH_INTERVAL_S", "1.0",
         "seconds between readiness polls of Triton (env GATEWAY_HEALTH_INTERVAL_S; default 1)", float),
    Flag("--tokenizer-path", "GATEWAY_TOKENIZER_PATH", None,
         "checkpoint folder whose tokenizer Tokenize uses (env GATEWAY_TOKENIZER_PATH; "
         "default: the preprocess model's tokenizer_path, read from Triton)", Path),
    Flag("--model-root", "GATEWAY_MODEL_ROOT", None,
         "folder that relative paths in Triton's model configs are relative to (env GATEWAY_MODEL_ROOT)", Path),
    Flag("--openai-listen", "OPENAI_LISTEN", "0.0.0.0:{OPENAI_PORT}",
         "address of the OpenAI-compatible HTTP API, HOST:PORT or off (env OPENAI_LISTEN, "
         "else 0.0.0.0:$OPENAI_PORT; default 0.0.0.0:9000)"),
    Flag("--triton-metrics-url", "GATEWAY_TRITON_METRICS_URL", "http://localhost:{METRICS_PORT}/metrics",
         "Triton's Prometheus endpoint, served again at the HTTP API's /metrics "
         "(env GATEWAY_TRITON_METRICS_URL; default http://localhost:$METRICS_PORT/metrics)"),
    Flag("--log-level", "GATEWAY_LOG_LEVEL", "INFO", "env GATEWAY_LOG_LEVEL; default INFO"),
)


def parser(env: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """Every flag of ``FLAGS``, its default read from its variable (``ValueError`` for a malformed number)."""
    env = os.environ if env is None else env
    ports = {name: _env_default(env, name, default) for name, default in PORT_VARIABLES.items()}
    ap = argparse.ArgumentParser(prog="python -m gateway",
                                 description="The typed gRPC API (triton_llm.v1.LLMService) in front of Triton's ensemble.")
    for flag in FLAGS:
        fallback = flag.default.format(**ports) if flag.default is not None else None
        value = _env_default(env, flag.env, fallback)
        default = value if value is None or flag.type is Path else flag.type(value)
        ap.add_argument(flag.name, type=flag.type, default=default, help=flag.help)
    return ap


def from_args(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> GatewayConfig:
    env = os.environ if env is None else env
    try:
        args = parser(env).parse_args(argv)
    except ValueError as e:  # a malformed numeric environment variable
        raise ConfigError(f"gateway environment: {e}") from None
    tokens = tuple(t.strip() for t in (env.get("GATEWAY_AUTH_TOKENS") or "").split(",") if t.strip())
    try:
        tracing = TracingSettings.from_env(env)
    except TracingConfigError as e:   # names the OTEL_* variable
        raise ConfigError(str(e)) from None
    values = {flag.field: getattr(args, flag.field) for flag in FLAGS}
    if values["openai_listen"].strip().lower() in ("off", ""):
        values["openai_listen"] = None
    return GatewayConfig(**values, auth_tokens=tokens, tracing=tracing)


# ---- bearer tokens -------------------------------------------------------------------------------------

def read_token_file(path: Path) -> list[str]:
    """Tokens from a file: one per line; blank lines and ``#`` comments ignored."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


@dataclass
class TokenSet:
    """Accepted bearer tokens, compared in constant time; the file is re-read when it changes
    (checked at most every ``reload_interval_s``), so a rotated Kubernetes secret takes effect."""

    static: tuple[str, ...] = ()
    path: Path | None = None
    reload_interval_s: float = 5.0
    _digests: tuple[bytes, ...] = ()
    _mtime: float | None = None
    _checked: float = 0.0
    _file_digests: tuple[bytes, ...] = field(default=())

    def __post_init__(self) -> None:
        self._reload(force=True)

    @staticmethod
    def _digest(token: str) -> bytes:
        return hashlib.sha256(token.encode("utf-8")).digest()

    def _reload(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked < self.reload_interval_s:
            return
        self._checked = now
        if self.path is not None:
            try:
                mtime = self.path.stat().st_mtime
                if force or mtime != self._mtime:
                    self._file_digests = tuple(self._digest(t) for t in read_token_file(self.path))
                    self._mtime = mtime
            except OSError:
                if force:
                    raise
                # keep the last good tokens when the file is briefly missing (secret rotation)
        self._digests = tuple(self._digest(t) for t in self.static) + self._file_digests

    @property
    def enabled(self) -> bool:
        return bool(self.static) or self.path is not None

    def check(self, token: str) -> bool:
        """True if ``token`` is accepted. Compares SHA-256 digests with ``hmac.compare_digest`` against
        every token (no early exit), so the time taken says nothing about the tokens."""
        self._reload()
        presented = self._digest(token)
        ok = False
        for d in self._digests:
            ok |= hmac.compare_digest(presented, d)
        return ok
