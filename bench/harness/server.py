"""The Triton side of a benchmark: the engine config the ``llm`` model builds, and a tritonserver for one run.

- ``repository_overrides`` / ``engine_config``: ``--model`` and ``--set MODEL.KEY=VALUE`` as the
  started server sees them, and the same ``EngineConfig`` for an in-process engine beside it;
- ``run_with_server(body, ...)``: ``body(url, server)`` against a running server (``--url``) or
  one started here on free ports bound to 127.0.0.1, always stopped afterwards (also on Ctrl-C,
  SIGTERM or a failed start), its log kept as ``<out>/<name>_server.log``;
- ``check_alive``: raise ``ServerDied`` once the started server has exited.
"""
from __future__ import annotations

import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from cli.launcher import (
    CACHE,
    MODEL_REPOSITORY,
    LauncherError,
    Ports,
    TritonServer,
    render_model_repository,
    set_parameters,
)

T = TypeVar("T")

_PARAM = re.compile(r'parameters\s*[:]?\s*\{\s*key:\s*"([^"]+)"\s*,?\s*value:\s*\{\s*string_value:\s*"((?:[^"\\]|\\.)*)"')


def pbtxt_parameters(text: str) -> dict[str, str]:
    """``parameters { key: ... value: { string_value: ... } }`` of a config.pbtxt as a dict."""
    return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _PARAM.findall(text)}


def repository_overrides(model: Path | None, sets: Sequence[str]) -> dict[str, dict[str, str]]:
    """``--model`` points every model of the ensemble at one checkpoint; ``--set`` adds any parameter."""
    from cli.serve import parse_overrides

    out: dict[str, dict[str, str]] = {}
    if model is not None:
        out = {"llm": {"model_path": str(model)}, "preprocess": {"tokenizer_path": str(model)},
               "postprocess": {"tokenizer_path": str(model)}}
    for m, params in parse_overrides(list(sets)).items():
        out.setdefault(m, {}).update(params)
    return out


def engine_config(overrides: dict[str, dict[str, str]]):
    """The EngineConfig the ``llm`` model builds from its config.pbtxt (with the same overrides), and its parameters."""
    from backend.config import EngineConfig
    from backend.serving.llm_startup import split_parameters
    from contracts.triton_config import resolve_paths

    text = set_parameters((MODEL_REPOSITORY / "llm" / "config.pbtxt").read_text(), overrides.get("llm", {}))
    engine_params, _ = split_parameters(resolve_paths(pbtxt_parameters(text)))
    return EngineConfig.from_parameters(engine_params), engine_params


class ServerDied(LauncherError):
    """The tritonserver started by this run exited during the measurement."""


class Terminated(Exception):
    """SIGTERM arrived during ``run_with_server``."""


def _on_sigterm(*_):
    raise Terminated()


def check_alive(server: TritonServer | None, during: str) -> None:
    """Raise ``ServerDied`` if ``server`` (started by this run; None: not ours) has exited."""
    if server is not None and server.proc is not None and server.proc.poll() is not None:
        raise ServerDied(f"tritonserver exited with code {server.proc.returncode} during {during}")


def run_with_server(body: Callable[[str, TritonServer | None], T], overrides: dict[str, dict[str, str]], *,
                    url: str | None, out: Path, name: str, server_timeout: float) -> T | None:
    """``body(grpc url, server)``: against ``url``, or a tritonserver started here (``server`` None for ``url``).

    The started server renders the model repository with ``overrides`` into ``.cache/bench_<name>.*/``
    and is always stopped. Returns None when the run stopped (launcher error, server died, SIGTERM,
    Ctrl-C), after saying why and showing the server log's tail on stderr.
    """
    server = tmpdir = None
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if url is None:
            CACHE.mkdir(parents=True, exist_ok=True)
            tmpdir = Path(tempfile.mkdtemp(prefix=f"bench_{name}.", dir=CACHE))
            repo = render_model_repository(tmpdir / "model_repository", overrides)
            ports = Ports.free()
            server = TritonServer(repo, ports, log_path=tmpdir / "server.log", extra_args=[
                "--exit-timeout-secs=10", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
                "--metrics-address=127.0.0.1"])
            print(f"starting tritonserver (gRPC 127.0.0.1:{ports.grpc}, log {tmpdir / 'server.log'}) ...", flush=True)
            server.start()
            server.wait_ready(timeout=server_timeout)
            url = f"127.0.0.1:{ports.grpc}"
        return body(url, server)
    except (LauncherError, Terminated, KeyboardInterrupt) as e:
        print(f"\nstopped: {type(e).__name__}: {e}", file=sys.stderr)
        if server is not None:
            print("--- server log tail ---\n" + server.log_tail(25), file=sys.stderr)
        return None
    finally:
        if server is not None:
            code = server.stop(timeout=30)
            print(f"tritonserver stopped (exit code {code})", flush=True)
        if tmpdir is not None:
            out.mkdir(parents=True, exist_ok=True)
            if (tmpdir / "server.log").is_file():
                shutil.copy(tmpdir / "server.log", out / f"{name}_server.log")
                print(f"server log: {out / f'{name}_server.log'}", flush=True)
            shutil.rmtree(tmpdir, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)
