"""``make serve``: run tritonserver on model_repository/ (preprocess -> llm -> postprocess ensemble).

Ports come from HTTP_PORT / GRPC_PORT / METRICS_PORT (default 8000 / 8001 / 8002). The server binary
is $TRITONSERVER, else ``tritonserver`` on PATH (NGC image), else the one bundled in nvidia-pytriton.
Engine settings are the ``parameters`` of model_repository/llm/config.pbtxt; ``--set llm.KEY=VALUE``
overrides one for this run (e.g. ``--set llm.model_path=/path/to/checkpoint``). Ctrl-C stops it.

Beside it, the typed gRPC gateway (``python -m gateway``, docs/api-grpc.md) listens on GATEWAY_PORT
(default 50051); its auth and TLS come from GATEWAY_AUTH_TOKEN_FILE / GATEWAY_AUTH_TOKENS /
GATEWAY_TLS_CERT / GATEWAY_TLS_KEY. ``--no-gateway`` runs tritonserver alone.
"""
from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from tools.triton_launcher import (CACHE, MODEL_REPOSITORY, LauncherError, Ports, TritonServer, find_tritonserver,
                                   render_model_repository)


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-repository", type=Path, default=MODEL_REPOSITORY)
    ap.add_argument("--set", action="append", default=[], metavar="MODEL.KEY=VALUE",
                    help="override a config.pbtxt parameter for this run (repeatable)")
    ap.add_argument("--log-verbose", type=int, default=0)
    ap.add_argument("--no-gateway", action="store_true", help="do not start the typed gRPC gateway (GATEWAY_PORT)")
    args = ap.parse_args(argv)
    gateway = None
    try:
        ports = Ports.from_env()
        overrides = parse_overrides(args.set)
        repo = args.model_repository
        if overrides:
            CACHE.mkdir(parents=True, exist_ok=True)
            repo = render_model_repository(Path(tempfile.mkdtemp(prefix="model_repository.", dir=CACHE)), overrides,
                                           src=args.model_repository)
        install = find_tritonserver()
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
        if not args.no_gateway:
            gateway = start_gateway(server)
        print("\nready:")
        print(f"  gRPC     {server.grpc_url}    (KServe v2; model 'ensemble', decoupled: use streaming)")
        print(f"  HTTP     http://{server.http_url}  (/v2/health/ready, /v2/models/ensemble/config)")
        print(f"  metrics  {server.metrics_url}")
        print(f"  try:     python -m tools.client \"def fibonacci(n):\" --max-tokens 64 --url {server.grpc_url}")
        if gateway is not None:
            print(f"  gateway  {gateway.target}  (triton_llm.v1.LLMService, gRPC health and reflection)")
            print(f"  try:     python -m tools.client \"def fibonacci(n):\" --max-tokens 64 --gateway --url {gateway.target}")
        print("Ctrl-C to stop.", flush=True)
        return server.proc.wait() if server.proc else 0
    except KeyboardInterrupt:
        print("\nstopping tritonserver ...", flush=True)
        return 0
    except LauncherError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if gateway is not None:  # first, so its in-flight streams can finish while Triton still serves them
            gateway.stop()
        server.stop()
        if repo != args.model_repository:  # the rendered copy with --set overrides
            shutil.rmtree(repo, ignore_errors=True)


def start_gateway(server: TritonServer):
    """``python -m gateway`` on 0.0.0.0:$GATEWAY_PORT in front of ``server``; returns once it is SERVING."""
    import os

    from gateway.launcher import GatewayProcess

    raw = os.environ.get("GATEWAY_PORT", "50051")
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise LauncherError(f"GATEWAY_PORT: expected a port number, got {raw!r}")
    gateway = GatewayProcess(f"0.0.0.0:{raw}", server.grpc_url).start()
    try:
        cert = os.environ.get("GATEWAY_TLS_CERT")
        gateway.wait_ready(timeout=60, root_certificates=open(cert, "rb").read() if cert else None)
    except Exception as e:
        gateway.stop()
        raise LauncherError(f"the gateway did not start: {e}") from None
    return gateway


if __name__ == "__main__":
    sys.exit(main())
