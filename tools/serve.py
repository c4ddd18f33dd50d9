"""``make serve``: run tritonserver on model_repository/ (preprocess -> llm -> postprocess ensemble).

Ports come from HTTP_PORT / GRPC_PORT / METRICS_PORT (default 8000 / 8001 / 8002). The server binary
is $TRITONSERVER, else ``tritonserver`` on PATH (NGC image), else the one bundled in nvidia-pytriton.
Engine settings are the ``parameters`` of model_repository/llm/config.pbtxt; ``--set llm.KEY=VALUE``
overrides one for this run (e.g. ``--set llm.model_path=/path/to/checkpoint``). Ctrl-C stops it.
"""
from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
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
    args = ap.parse_args(argv)
    try:
        ports = Ports.from_env()
        overrides = parse_overrides(args.set)
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
        t0 = time.monotonic()
        code = server.stop()
        if code not in (0, None, -signal.SIGINT):
            print(f"tritonserver exited with code {code} after {time.monotonic() - t0:.0f} s of shutdown"
                  + (" (an ensemble request Triton rejected keeps the ensemble from unloading: docs/serving.md, "
                     "'Known Triton 2.51 issues')" if time.monotonic() - t0 > 20 else ""), file=sys.stderr)
        if repo != args.model_repository:  # the rendered copy with --set overrides
            shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
