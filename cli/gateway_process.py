"""Run ``python -m gateway`` as a child process (``make serve``, end-to-end tests, the benchmark).

``GatewayProcess(listen, triton_url, ...).start()`` then ``wait_ready()`` (the standard gRPC health
check on the listen port says SERVING, i.e. the ensemble is ready, and the OpenAI-compatible API
answers ``/health`` when ``openai_listen`` turns it on; off by default) and ``stop()`` (SIGTERM: the
gateway's graceful shutdown, SIGKILL after ``timeout``). Auth and TLS settings travel as flags or
through the environment (``GATEWAY_AUTH_TOKEN_FILE``, ``GATEWAY_AUTH_TOKENS``, ``GATEWAY_TLS_CERT``,
``GATEWAY_TLS_KEY``), which the child inherits. The child gets SIGTERM when this process dies
(``die_with_parent``), so a killed launcher does not leave the gateway holding its port.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from cli.child_process import ChildProcess, die_with_parent, stop_process

from gateway.config import REPO


class GatewayError(RuntimeError):
    """The gateway exited or did not become ready."""


class GatewayProcess(ChildProcess):
    name, ready_state, error = "gateway", "SERVING", GatewayError

    def __init__(self, listen: str, triton_url: str, *, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None, log_path: Path | None = None, python: str = sys.executable,
                 openai_listen: str | None = None, triton_metrics_url: str | None = None) -> None:
        self.listen = listen
        self.openai_listen = openai_listen
        self.triton_metrics_url = triton_metrics_url
        self.triton_url = triton_url
        self.extra_args = list(extra_args or [])
        self.env = env
        self.log_path = log_path
        self.python = python
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    @property
    def target(self) -> str:
        """Where a client on this machine connects."""
        return f"localhost:{self.port}"

    @property
    def openai_url(self) -> str | None:
        """The OpenAI-compatible API's base URL for a client on this machine (None: off)."""
        if self.openai_listen is None:
            return None
        scheme = "https" if (self.env or os.environ).get("GATEWAY_TLS_CERT") else "http"
        return f"{scheme}://localhost:{self.openai_listen.rsplit(':', 1)[1]}"

    def command(self) -> list[str]:
        cmd = [self.python, "-m", "gateway", "--listen", self.listen, "--triton-url", self.triton_url,
               "--openai-listen", self.openai_listen or "off"]
        if self.triton_metrics_url:
            cmd += ["--triton-metrics-url", self.triton_metrics_url]
        return cmd + self.extra_args

    def start(self) -> "GatewayProcess":
        env = dict(os.environ if self.env is None else self.env)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env.setdefault("PYTHONUNBUFFERED", "1")
        out = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")
            out = self._log
        self.proc = subprocess.Popen(self.command(), env=env, cwd=str(REPO), stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=die_with_parent())
        return self

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return "(gateway output goes to the terminal)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def health(self, timeout: float = 1.0, root_certificates: bytes | None = None) -> str:
        """The health status of service "" (SERVING, NOT_SERVING, ...) or UNREACHABLE."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        creds = grpc.ssl_channel_credentials(root_certificates) if root_certificates else None
        channel = grpc.secure_channel(self.target, creds) if creds else grpc.insecure_channel(self.target)
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
            return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
        except grpc.RpcError:
            return "UNREACHABLE"
        finally:
            channel.close()

    def http_up(self) -> bool:
        """The OpenAI-compatible API answers /health (True when it is off)."""
        if self.openai_url is None:
            return True
        import ssl
        import urllib.request

        ctx = ssl._create_unverified_context() if self.openai_url.startswith("https") else None
        try:
            with urllib.request.urlopen(self.openai_url + "/health", timeout=1.0, context=ctx) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = 60.0, root_certificates: bytes | None = None) -> None:
        """Block until health says SERVING; raise with the log tail if the process exits or time runs out."""
        self.wait_until(lambda: self.health(root_certificates=root_certificates) == "SERVING" and self.http_up(),
                        timeout, interval=0.2)

    def tail_note(self) -> str:
        return f".\n--- gateway log ---\n{self.log_tail()}"

    def start_ready(self, timeout: float = 60.0) -> "GatewayProcess":
        """``start`` and ``wait_ready``; a gateway that does not get ready is stopped before the error propagates."""
        self.start()
        try:
            self.wait_ready(timeout=timeout)
        except Exception:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 35.0) -> int | None:
        proc, self.proc = self.proc, None
        code = None
        if proc is not None:
            code = stop_process(proc, signal.SIGTERM, timeout)
        if self._log is not None:
            self._log.close()
            self._log = None
        return code
