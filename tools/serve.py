"""``make serve``: run tritonserver on model_repository/ (preprocess -> llm -> postprocess ensemble).

Ports come from HTTP_PORT / GRPC_PORT / METRICS_PORT (default 8000 / 8001 / 8002). The server binary
is $TRITONSERVER, else ``tritonserver`` on PATH (NGC image), else the one bundled in nvidia-pytriton.
Engine settings are the ``parameters`` of model_repository/llm/config.pbtxt; ``--set llm.KEY=VALUE``
overrides one for this run (e.g. ``--set llm.model_path=/path/to/checkpoint``). Ctrl-C stops it.
``OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318`` sends traces there (docs/observability.md).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from contracts.tracing import TracingConfigError, TracingSettings
from tools.triton_launcher import (CACHE, MODEL_REPOSITORY, LauncherError, Ports, TritonServer, find_tritonserver,
                                   otel_trace_args, render_model_repository)


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


def tracing_summary(env=None) -> str:
    """One line on where traces go (OTEL_EXPORTER_OTLP_ENDPOINT, docs/observability.md)."""
    try:
        settings = TracingSettings.from_env(env)
    except TracingConfigError as e:
        return f"off ({e})"
    if settings is None:
        return "off (set OTEL_EXPORTER_OTLP_ENDPOINT, e.g. http://localhost:4318, to send traces)"
    share = "none sampled" if settings.triton_rate is None else f"1 request in {settings.triton_rate}"
    return f"{settings.traces_url} as {settings.service_name!r}, {share}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-repository", type=Path, default=MODEL_REPOSITORY)
    ap.add_argument("--set", action="append", default=[], metavar="MODEL.KEY=VALUE",
                    help="override a config.pbtxt parameter for this run (repeatable)")
    ap.add_argument("--log-verbose", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        ports = Ports.from_env()
        overrides = parse_overrides(args.set)
        repo = args.model_repository
        if overrides:
            CACHE.mkdir(parents=True, exist_ok=True)
            repo = render_model_repository(Path(tempfile.mkdtemp(prefix="model_repository.", dir=CACHE)), overrides,
                                           src=args.model_repository)
        install = find_tritonserver()
        otel_trace_args(os.environ)   # a bad OTEL_* value stops here, naming the variable
    except LauncherError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    server = TritonServer(repo, ports, install=install, log_verbose=args.log_verbose)
    print(f"tritonserver: {install.binary} (from {install.source})")
    print(f"model repository: {repo}")
    server.start()
    # tritonserver runs in its own session: Ctrl-C (KeyboardInterrupt here) and SIGTERM become one
    # SIGINT to it (its graceful shutdown), then SIGKILL if it has not exited 30 s later.
    signal.signal(signal.SIGTERM, lambda *_: server.proc and server.proc.send_signal(signal.SIGINT))
    try:
        server.wait_ready(timeout=600)
        print("\nready:")
        print(f"  gRPC     {server.grpc_url}    (KServe v2; model 'ensemble', decoupled: use streaming)")
        print(f"  HTTP     http://{server.http_url}  (/v2/health/ready, /v2/models/ensemble/config)")
        print(f"  metrics  {server.metrics_url}")
        print(f"  traces   {tracing_summary()}")
        print(f"  try:     python -m tools.client \"def fibonacci(n):\" --max-tokens 64 --url {server.grpc_url}")
        print("Ctrl-C to stop.", flush=True)
        return server.proc.wait() if server.proc else 0
    except KeyboardInterrupt:
        print("\nstopping tritonserver ...", flush=True)
        return 0
    except LauncherError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        server.stop()
        if repo != args.model_repository:  # the rendered copy with --set overrides
            shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
