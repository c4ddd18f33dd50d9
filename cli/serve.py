"""``make serve``: run tritonserver on model_repository/ (preprocess -> llm -> postprocess ensemble).

Ports come from HTTP_PORT / GRPC_PORT / METRICS_PORT (default 8000 / 8001 / 8002). The server binary
is $TRITONSERVER, else ``tritonserver`` on PATH (NGC image), else the one bundled in nvidia-pytriton.
Engine settings are the ``parameters`` of model_repository/llm/config.pbtxt; ``--set llm.KEY=VALUE``
overrides one for this run (e.g. ``--set llm.model_path=/path/to/checkpoint``). Ctrl-C stops it.

From the environment (how the container image and the Helm chart configure it, see ``settings_from_env``):
``TRITON_LLM_SET`` holds ``--set`` items separated by whitespace or newlines (shell quoting for values
with spaces), applied before the ``--set`` flags, so a flag wins; ``TRITON_LLM_SERVER_ARGS`` holds extra
tritonserver arguments (e.g. ``--exit-timeout-secs=15``); ``TRITON_LLM_DRAIN_SECONDS`` makes SIGTERM
wait for in-flight requests before stopping tritonserver (``drain``). The whole environment reaches
tritonserver and its Python models, ``OTEL_EXPORTER_OTLP_ENDPOINT`` included. tritonserver listens on all
interfaces (its default ``0.0.0.0``), so probes from outside the container reach ``/v2/health/{live,ready}``.

Beside it, the typed gRPC gateway (``python -m gateway``, docs/api-grpc.md) listens on GATEWAY_PORT
(default 50051; GATEWAY_LISTEN=HOST:PORT instead) and the OpenAI-compatible HTTP API on OPENAI_PORT
(default 9000, docs/api-openai.md; OPENAI_LISTEN=HOST:PORT or ``off`` instead); their auth and TLS come from
GATEWAY_AUTH_TOKEN_FILE / GATEWAY_AUTH_TOKENS / GATEWAY_TLS_CERT / GATEWAY_TLS_KEY. ``--no-gateway`` runs
tritonserver alone. Two of these five ports set to one number are refused before anything starts, naming both
variables (``cli/serve_ports.py``).

While it serves, the launcher watches the Python stubs of tritonserver every second and restarts tritonserver
when one dies (``cli/supervisor.py``); its liveness file (``TRITON_LLM_LIVENESS_FILE``) backs the container's
liveness probe, ``python -m cli.liveness`` (docs/reliability.md).

tritonserver's output is echoed (less two harmless CUDA lines without a GPU) and kept in ``--log-file``; if it exits
before it is ready, the last line repeats the first model-load error of its log (``cli/server_log.py``).

``OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318`` sends traces there (docs/observability.md).
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from tracing import LOCAL_SCHEDULE_DELAY_MS, TracingConfigError, TracingSettings
from cli.serve_ports import GatewayListen, check_distinct, gateway_listen_from_env
from cli.supervisor import Supervisor, liveness_path_from_env
from cli.launcher import (
    CACHE,
    MODEL_REPOSITORY,
    LauncherError,
    Ports,
    TritonServer,
    cuda_device_present,
    find_tritonserver,
    otel_trace_args,
    render_model_repository,
)


def parse_overrides(items: list[str]) -> dict[str, dict[str, str]]:
    """``["llm.model_path=/x", "preprocess.tokenizer_path=/x"]`` -> ``{"llm": {...}, "preprocess": {...}}``."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        model, dot, param = key.partition(".")
        if not sep or not dot or not model or not param:
            raise LauncherError(f"--set: expected MODEL.PARAMETER=VALUE, got {item!r}")
        out.setdefault(model, {})[param] = value
    return out


LOG_FILE = CACHE / "tritonserver.log"
SET_ENV = "TRITON_LLM_SET"
SERVER_ARGS_ENV = "TRITON_LLM_SERVER_ARGS"
_LAUNCHER_FLAGS = ("--model-repository", "--model-store", "--http-port", "--grpc-port", "--metrics-port")


def settings_from_env(env: Mapping[str, str] | None = None) -> tuple[list[str], list[str]]:
    """(``--set`` items from ``$TRITON_LLM_SET``, extra tritonserver arguments from ``$TRITON_LLM_SERVER_ARGS``).

    Both are split like a shell command line (``shlex``): items are separated by spaces or newlines
    and a value with spaces is quoted, ``'llm.model_path=/models/my model'``. Unset or blank: nothing.
    The launcher's own flags (model repository, ports: use HTTP_PORT / GRPC_PORT / METRICS_PORT) are
    refused in the server arguments.
    """
    env = os.environ if env is None else env
    out = []
    for name in (SET_ENV, SERVER_ARGS_ENV):
        try:
            out.append(shlex.split(env.get(name, "")))
        except ValueError as e:  # unbalanced quotes
            raise LauncherError(f"{name}: {e}") from None
    items, server_args = out
    for item in items:
        try:
            parse_overrides([item])
        except LauncherError:
            raise LauncherError(f"{SET_ENV}: expected MODEL.PARAMETER=VALUE items, got {item!r}") from None
    for arg in server_args:
        if arg.split("=", 1)[0] in _LAUNCHER_FLAGS:
            raise LauncherError(f"{SERVER_ARGS_ENV}: {arg.split('=', 1)[0]} is set by the launcher "
                                "(ports come from HTTP_PORT, GRPC_PORT, METRICS_PORT)")
    return items, server_args


DRAIN_ENV = "TRITON_LLM_DRAIN_SECONDS"
# The llm model's gauge of requests in the engine, running or waiting (backend/serving/metrics.py).
ACTIVE_GAUGE = ("nv_trt_llm_request_metrics{", 'request_type="active"')


def drain_seconds_from_env(env: Mapping[str, str] | None = None) -> float:
    """``$TRITON_LLM_DRAIN_SECONDS`` (default 0: SIGTERM stops tritonserver at once)."""
    raw = (os.environ if env is None else env).get(DRAIN_ENV, "").strip() or "0"
    try:
        seconds = float(raw)
    except ValueError:
        raise LauncherError(f"{DRAIN_ENV}: expected a number of seconds, got {raw!r}") from None
    if not 0 <= seconds < 86400:
        raise LauncherError(f"{DRAIN_ENV}: expected 0 to 86399 seconds, got {raw!r}")
    return seconds


def active_requests(metrics_url: str, timeout: float = 2.0) -> float | None:
    """Requests in the engine (the active gauge summed over models), or None without an answer or gauge."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout) as r:
            text = r.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(ACTIVE_GAUGE[0]) and ACTIVE_GAUGE[1] in line]
    return sum(values) if values else None


def drain(read_active, seconds: float, *, quiet_s: float = 2.5, poll_s: float = 0.5,
          clock=time.monotonic, sleep=time.sleep) -> bool:
    """Wait until ``read_active()`` has read 0 for ``quiet_s``, or until ``seconds`` have passed; True when
    drained. None from the first read means no engine gauge (not loaded yet, metrics off): nothing to wait
    for; a later None (no answer) counts as unknown.

    Why before stopping tritonserver: once told to stop, Triton 2.51 refuses to enqueue an ensemble's next
    steps (postprocess), so a stream still in flight would stall until the exit timeout and never finish.
    Meanwhile tritonserver keeps serving (Kubernetes has taken the pod out of the Service by then). The
    gauge refreshes every metrics_interval_s (1 s), hence the quiet time.
    """
    deadline, quiet_since, first = clock() + seconds, None, True
    while clock() < deadline:
        active = read_active()
        if active is None and first:
            return True
        first = False
        if active == 0:
            quiet_since = clock() if quiet_since is None else quiet_since
            if clock() - quiet_since >= quiet_s:
                return True
        elif active is not None:
            quiet_since = None
        sleep(poll_s)
    return False


def stop_on_sigterm(server: TritonServer, drain_s: float, supervisor: Supervisor | None = None) -> None:
    """SIGTERM: drain for up to ``drain_s`` (in a thread), then SIGINT to tritonserver (its graceful stop);
    ``supervisor`` stops restarting it from the start of the drain."""
    started = threading.Event()

    def interrupt() -> None:
        if supervisor is not None:
            supervisor.request_stop()
        if drain_s > 0:
            print(f"SIGTERM: letting in-flight requests finish (up to {drain_s:.0f} s) ...", flush=True)
            drained = drain(lambda: active_requests(server.metrics_url), drain_s)
            print("drained" if drained else "drain time is up: stopping with requests in flight", flush=True)
        proc = server.proc  # None once main() has stopped it
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)

    def handler(*_) -> None:
        if not started.is_set():
            started.set()
            threading.Thread(target=interrupt, name="drain", daemon=True).start()

    signal.signal(signal.SIGTERM, handler)

def tracing_summary(env=None) -> str:
    """One line on where traces go (OTEL_EXPORTER_OTLP_ENDPOINT, docs/observability.md)."""
    try:
        settings = TracingSettings.from_env(env)
    except TracingConfigError as e:
        return f"off ({e})"
    if settings is None:
        return "off (set OTEL_EXPORTER_OTLP_ENDPOINT, e.g. http://localhost:4318, to send traces)"
    share = "none sampled" if settings.triton_rate is None else \
        f"1 request in {settings.triton_rate}, sent within {settings.schedule_delay_ms} ms"
    return f"{settings.traces_url} as {settings.service_name!r}, {share}"


def local_trace_env(env: Mapping[str, str]) -> dict[str, str]:
    """``OTEL_BSP_SCHEDULE_DELAY`` = ``LOCAL_SCHEDULE_DELAY_MS`` (1000) for tritonserver, the models and the
    gateway when traces go to this machine (``localhost``, ``127.x``, ``::1``: the trace viewer, a local Jaeger)
    and the variable is unset, so a trace shows within a few seconds of its request rather than after the
    spec's 5 s delay; {} otherwise (a remote collector keeps the spec's batching)."""
    try:
        settings = TracingSettings.from_env(env)
    except TracingConfigError:
        return {}
    if settings is None or env.get("OTEL_BSP_SCHEDULE_DELAY", "").strip():
        return {}
    host = urllib.parse.urlsplit(settings.traces_url).hostname or ""
    if host in ("localhost", "::1") or host.startswith("127."):
        return {"OTEL_BSP_SCHEDULE_DELAY": str(LOCAL_SCHEDULE_DELAY_MS)}
    return {}


def client_command(python: str | None = None, cwd: Path | None = None) -> str:
    """How to run the CLI client from a plain shell: the ``llm-client`` script ``pip install -e .`` put
    beside this interpreter (relative to ``cwd`` when under it), else this interpreter with ``-m cli.client``
    (a bare ``python`` outside the virtual environment lacks its packages)."""
    python_path = Path(python or sys.executable)
    cwd = Path.cwd() if cwd is None else cwd
    script = python_path.parent / "llm-client"
    chosen = script if script.is_file() else python_path
    try:
        shown = str(chosen.relative_to(cwd))
    except ValueError:
        shown = str(chosen)
    return shown if chosen == script else f"{shown} -m cli.client"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-repository", type=Path, default=MODEL_REPOSITORY)
    ap.add_argument("--set", action="append", default=[], metavar="MODEL.KEY=VALUE",
                    help="override a config.pbtxt parameter for this run (repeatable)")
    ap.add_argument("--log-verbose", type=int, default=0)
    ap.add_argument("--log-file", type=Path, default=LOG_FILE,
                    help="tritonserver's whole log, also echoed here (default .cache/tritonserver.log)")
    ap.add_argument("--no-gateway", action="store_true",
                    help="do not start the gateway (the typed gRPC API on GATEWAY_PORT, the OpenAI API on OPENAI_PORT)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gateway = None
    try:
        ports = Ports.from_env()
        listen = None if args.no_gateway else gateway_listen_from_env(os.environ)
        check_distinct(ports, listen)    # before anything starts: no server may find its port taken by another
        env_items, server_args = settings_from_env()
        drain_s = drain_seconds_from_env()
        overrides = parse_overrides(env_items + args.set)  # a --set flag wins over the environment
        repo = args.model_repository
        if overrides:
            CACHE.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix="model_repository.", dir=CACHE))
            try:
                repo = render_model_repository(tmp, overrides, src=args.model_repository)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)   # a bad --set leaves nothing behind
                raise
        install = find_tritonserver()
        otel_trace_args(os.environ)   # a bad OTEL_* value stops here, naming the variable
    except LauncherError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    trace_env = local_trace_env(os.environ)
    server = TritonServer(repo, ports, install=install, log_verbose=args.log_verbose, extra_args=server_args,
                          log_path=args.log_file, echo=True, env=trace_env)
    print(f"tritonserver: {install.binary} (from {install.source})")
    print(f"model repository: {repo}")
    print(f"log: {args.log_file}" + ("" if cuda_device_present() else " (all of it: the 2 harmless CUDA E lines of a "
                                     "start without a GPU are only there, docs/serving.md)"))
    server.start()
    # tritonserver runs in its own session: Ctrl-C (KeyboardInterrupt here) and SIGTERM become one
    # SIGINT to it (its graceful shutdown), then SIGKILL if it has not exited 30 s later. SIGTERM first
    # drains for $TRITON_LLM_DRAIN_SECONDS (stop_on_sigterm).
    supervisor = Supervisor(server, liveness_path=liveness_path_from_env())
    stop_on_sigterm(server, drain_s, supervisor)
    ready = False
    try:
        supervisor.write_liveness()
        server.wait_ready(timeout=600)
        ready = True
        supervisor.arm()      # the stubs of the ready server; the liveness file says serving
        if listen is not None:
            gateway = start_gateway(server, listen, trace_env)
        print("\nready:")
        print(f"  gRPC     {server.grpc_url}    (KServe v2; model 'ensemble', decoupled: use streaming)")
        print(f"  HTTP     http://{server.http_url}  (/v2/health/ready, /v2/models/ensemble/config)")
        print(f"  metrics  {server.metrics_url}")
        print(f"  traces   {tracing_summary({**os.environ, **trace_env})}")
        client = client_command()
        print(f"  try:     {client} \"def fibonacci(n):\" --max-tokens 64 --url {server.grpc_url}")
        if gateway is not None:
            print(f"  gateway  {gateway.target}  (triton_llm.v1.LLMService, gRPC health and reflection)")
            print(f"  try:     {client} \"def fibonacci(n):\" --max-tokens 64 --gateway --url {gateway.target}")
            if gateway.openai_url is not None:
                print(f"  OpenAI   {gateway.openai_url}/v1  (chat, completions, models; /metrics; docs/api-openai.md)")
        print("Ctrl-C to stop.", flush=True)
        # A dead Python stub restarts tritonserver (cli/supervisor.py); its own exit ends the launcher.
        return supervisor.run()
    except KeyboardInterrupt:
        print("\nstopping tritonserver ...", flush=True)
        return 0
    except LauncherError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if gateway is not None:  # first, so its in-flight streams can finish while Triton still serves them
            gateway.stop()
        t0 = time.monotonic()
        exited = server.proc is not None and server.proc.poll() is not None   # on its own, before the stop
        code = server.stop()
        if exited and ready and code != 0:   # not ready: the error said why already
            print(f"tritonserver exited with code {code}", file=sys.stderr)
        elif code not in (0, None, -signal.SIGINT) and not exited:
            print(f"tritonserver exited with code {code} after {time.monotonic() - t0:.0f} s of shutdown"
                  + (" (an ensemble request Triton rejected keeps the ensemble from unloading: docs/serving.md, "
                     "'Known Triton 2.51 issues')" if time.monotonic() - t0 > 20 else ""), file=sys.stderr)
        if repo != args.model_repository:  # the rendered copy with --set overrides
            shutil.rmtree(repo, ignore_errors=True)


def start_gateway(server: TritonServer, listen: GatewayListen, env: Mapping[str, str] | None = None):
    """``python -m gateway`` on ``listen`` (the typed gRPC API; the OpenAI-compatible HTTP API unless it is off) in
    front of ``server``, with ``env`` added to this environment; returns once both answer."""
    from cli.gateway_process import GatewayProcess

    gateway = GatewayProcess(listen.grpc.address, server.grpc_url, env={**os.environ, **(env or {})},
                             openai_listen=listen.openai.address if listen.openai is not None else None,
                             triton_metrics_url=server.metrics_url).start()
    try:
        cert = os.environ.get("GATEWAY_TLS_CERT")
        gateway.wait_ready(timeout=60, root_certificates=open(cert, "rb").read() if cert else None)
    except Exception as e:
        gateway.stop()
        raise LauncherError(f"the gateway did not start: {e}") from None
    return gateway


if __name__ == "__main__":
    sys.exit(main())
