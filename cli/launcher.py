"""Find, prepare and run a real ``tritonserver`` for this repository's model repository.

Used by ``cli/serve.py`` (``make serve``) and by the end-to-end test fixture.

Where the server comes from, in order:
1. ``$TRITONSERVER`` (path to the binary; its backends are taken from ``$TRITON_BACKEND_DIR``
   or ``<binary>/../../backends`` as in the NGC image layout ``/opt/tritonserver``);
2. ``tritonserver`` on ``PATH`` (the NGC ``tritonserver`` image);
3. the server bundled in the ``nvidia-pytriton`` wheel. Its Python backend needs the stub built for
   the running Python, so a copy of its ``backends/`` with that stub is prepared under
   ``.cache/triton_backends/py3.X``; its shared libraries come from ``nvidia_pytriton.libs``.

The Python models import the repository's packages, so the repository root goes on ``PYTHONPATH``,
and the interpreter's ``bin`` goes first on ``PATH`` so the stub's embedded interpreter finds this
virtual environment's packages.

Tracing: when the environment sets ``OTEL_EXPORTER_OTLP_ENDPOINT`` (tracing/), the server
runs in its OpenTelemetry trace mode pointed at it (``otel_trace_args``), and the Python models, which
inherit the environment, export their own spans there.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from cli.child_process import ChildProcess, die_with_parent, stop_process
from cli.server_log import WITHOUT_CUDA, LogTee, first_load_error
from tracing import TracingConfigError, TracingSettings

REPO = Path(__file__).resolve().parents[1]
MODEL_REPOSITORY = REPO / "model_repository"
CACHE = REPO / ".cache"


class LauncherError(RuntimeError):
    """The server could not be found, prepared, started or made ready."""


@dataclass(frozen=True)
class TritonInstall:
    """A runnable tritonserver: the binary, its backend directory and the environment it needs."""

    binary: Path
    backend_dir: Path | None
    env: dict[str, str] = field(default_factory=dict)
    source: str = ""


@dataclass(frozen=True)
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Ports":
        env = os.environ if env is None else env
        values = {}
        for name, default in (("HTTP_PORT", 8000), ("GRPC_PORT", 8001), ("METRICS_PORT", 8002)):
            raw = env.get(name, str(default))
            try:
                port = int(raw)
            except ValueError:
                raise LauncherError(f"{name}: expected a port number, got {raw!r}") from None
            if not 0 < port < 65536:
                raise LauncherError(f"{name}: port out of range, got {port}")
            values[name.split("_")[0].lower()] = port
        return cls(**values)

    @classmethod
    def free(cls) -> "Ports":
        return cls(*free_ports(3))


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free at the time of the call. The sockets stay bound until all are picked: one at a
    time, the kernel may hand out a port it has just released, and tritonserver then refused an HTTP port equal to
    its metrics port ("cannot listen to HTTP requests and metrics requests at the same address and port")."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """A TCP port free at the time of the call."""
    return free_ports(1)[0]


def cuda_device_present() -> bool:
    """An NVIDIA device node exists (checked without importing torch or CUDA)."""
    return Path("/dev/nvidiactl").exists() or any(Path("/dev").glob("nvidia[0-9]*"))


def _python_env(base: dict[str, str]) -> dict[str, str]:
    """PATH with this interpreter's bin first, PYTHONPATH with the repository root."""
    env: dict[str, str] = {}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir] + [p for p in base.get("PATH", "").split(os.pathsep) if p and p != bindir])
    paths = [str(REPO), sysconfig.get_paths()["purelib"]]
    extra = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    env["PYTHONPATH"] = os.pathsep.join(paths + extra)
    return env


def _pytriton_bundle() -> tuple[Path, Path] | None:
    """(tritonserver dir, shared libs dir) of the nvidia-pytriton wheel, if installed."""
    site = Path(sysconfig.get_paths()["purelib"])
    server = site / "pytriton" / "tritonserver"
    libs = site / "nvidia_pytriton.libs"
    if (server / "bin" / "tritonserver").is_file():
        return server, libs
    return None


def prepare_pytriton_backends(server_dir: Path, cache: Path = CACHE) -> Path:
    """A copy of the bundle's backends/ with the Python stub for the running interpreter."""
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server_dir / "python_backend_stubs" / ver / "triton_python_backend_stub"
    if not stub.is_file():
        have = sorted(p.name for p in (server_dir / "python_backend_stubs").iterdir())
        raise LauncherError(f"nvidia-pytriton has no Python backend stub for Python {ver} (has {', '.join(have)})")
    dest = cache / "triton_backends" / f"py{ver}"
    marker = dest / ".prepared-from"
    source_id = f"{server_dir}:{stub.stat().st_mtime_ns}"
    if marker.is_file() and marker.read_text() == source_id:
        return dest
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(server_dir / "backends", tmp, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(stub, tmp / "python" / "triton_python_backend_stub")
    (tmp / ".prepared-from").write_text(source_id)
    shutil.rmtree(dest, ignore_errors=True)
    try:
        tmp.rename(dest)
    except OSError:  # another process prepared it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def find_tritonserver(env: dict[str, str] | None = None, cache: Path = CACHE) -> TritonInstall:
    """Locate tritonserver ($TRITONSERVER, then PATH, then the nvidia-pytriton bundle)."""
    env = dict(os.environ if env is None else env)
    pyenv = _python_env(env)
    explicit = env.get("TRITONSERVER")
    if explicit:
        binary = Path(explicit)
        if not binary.is_file():
            raise LauncherError(f"TRITONSERVER={explicit!r} is not a file")
        return TritonInstall(binary, _backend_dir_for(binary, env), pyenv, "$TRITONSERVER")
    on_path = shutil.which("tritonserver", path=env.get("PATH"))
    if on_path:
        binary = Path(on_path)
        return TritonInstall(binary, _backend_dir_for(binary, env), pyenv, "PATH")
    bundle = _pytriton_bundle()
    if bundle is None:
        raise LauncherError(
            "tritonserver not found: set $TRITONSERVER, put tritonserver on PATH (NGC tritonserver image), "
            "or install nvidia-pytriton (make install)"
        )
    server_dir, libs = bundle
    backends = prepare_pytriton_backends(server_dir, cache)
    ld = [str(libs)] + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    pyenv["LD_LIBRARY_PATH"] = os.pathsep.join(ld)
    return TritonInstall(server_dir / "bin" / "tritonserver", backends, pyenv, "nvidia-pytriton")


def _backend_dir_for(binary: Path, env: dict[str, str]) -> Path | None:
    if env.get("TRITON_BACKEND_DIR"):
        return Path(env["TRITON_BACKEND_DIR"])
    guess = binary.resolve().parent.parent / "backends"
    return guess if guess.is_dir() else None  # None: the server's built-in default (/opt/tritonserver/backends)


def otel_trace_args(env: Mapping[str, str]) -> list[str]:
    """tritonserver's ``--trace-config`` flags for the OTEL_* environment ([] when tracing is off)."""
    try:
        settings = TracingSettings.from_env(env)
    except TracingConfigError as e:
        raise LauncherError(str(e)) from None
    return settings.triton_args() if settings is not None else []


_PARAM_RE = r'(key:\s*"{key}"\s*,?\s*value:\s*\{{\s*string_value:\s*)"[^"]*"'


def set_parameters(config_text: str, params: dict[str, str]) -> str:
    """Replace (or add) ``parameters`` string values in a config.pbtxt text."""
    for key, value in params.items():
        value = str(value).replace("\\", "\\\\").replace('"', '\\"')
        pattern = re.compile(_PARAM_RE.format(key=re.escape(key)))
        if pattern.search(config_text):
            config_text = pattern.sub(lambda m: f'{m.group(1)}"{value}"', config_text)
        else:
            config_text += f'\nparameters: {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
    return config_text


def render_model_repository(dest: Path, overrides: dict[str, dict[str, str]] | None = None,
                            src: Path = MODEL_REPOSITORY) -> Path:
    """Copy the model repository to ``dest`` with config.pbtxt parameter overrides per model.

    ``overrides = {"llm": {"model_path": "/tmp/ckpt", "kv_cache_bytes": "4000000"}}``.
    """
    overrides = overrides or {}
    models = sorted(p.name for p in src.iterdir() if p.is_dir())
    unknown = set(overrides) - set(models)
    if unknown:
        raise LauncherError(f"--set names unknown models {sorted(unknown)}; the models are {models}")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"))
    for model, params in overrides.items():
        cfg = dest / model / "config.pbtxt"
        cfg.write_text(set_parameters(cfg.read_text(), params))
    return dest


class TritonServer(ChildProcess):
    """A tritonserver child process: ``start()``, ``wait_ready()``, ``stop()``; a context manager.

    Its output goes to ``log_path`` (else the terminal); with ``echo`` too, to the terminal as well, less the
    harmless CUDA lines of a machine without a GPU (``cli/server_log.py``). A server that exits before it is
    ready raises ``LauncherError`` with the first model-load error of its log."""

    name, error = "tritonserver", LauncherError

    def __init__(self, model_repository: Path = MODEL_REPOSITORY, ports: Ports | None = None, *,
                 install: TritonInstall | None = None, log_path: Path | None = None,
                 extra_args: list[str] | None = None, log_verbose: int = 0, env: Mapping[str, str] | None = None,
                 echo: bool = False):
        self.model_repository = Path(model_repository)
        self.env = dict(env or {})      # added to os.environ for the server and its Python models
        self.ports = ports or Ports()
        self.install = install
        self.log_path = log_path
        self.echo = echo and log_path is not None
        self._tee: LogTee | None = None
        self.extra_args = list(extra_args or [])
        self.log_verbose = log_verbose
        self.proc: subprocess.Popen | None = None
        self._log_file = None
        self._started = False

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.ports.grpc}"

    @property
    def http_url(self) -> str:
        return f"localhost:{self.ports.http}"

    @property
    def metrics_url(self) -> str:
        return f"http://localhost:{self.ports.metrics}/metrics"

    def command(self) -> list[str]:
        assert self.install is not None
        cmd = [
            str(self.install.binary),
            f"--model-repository={self.model_repository}",
            f"--http-port={self.ports.http}",
            f"--grpc-port={self.ports.grpc}",
            f"--metrics-port={self.ports.metrics}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--allow-cpu-metrics=false",
            f"--log-verbose={self.log_verbose}",
            "--exit-on-error=true",
        ]
        if not cuda_device_present():
            cmd.append("--pinned-memory-pool-byte-size=0")   # no GPU: no pinned pool, and no W line about it
        if self.install.backend_dir is not None:
            cmd.append(f"--backend-directory={self.install.backend_dir}")
        return cmd + otel_trace_args(self.server_env()) + self.extra_args

    def server_env(self) -> dict[str, str]:
        """The environment of the server process (and of its Python model stubs)."""
        env = dict(os.environ)
        env.update(self.install.env if self.install is not None else {})
        env.update(self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def start(self) -> "TritonServer":
        if self.proc is not None:
            raise LauncherError("server already started")
        if self.install is None:
            self.install = find_tritonserver()
        env = self.server_env()
        command = self.command()
        out = None  # inherit the terminal
        if self.echo:
            out = subprocess.PIPE
        elif self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self.log_path, "ab" if self._started else "wb")   # a restart appends
            out = self._log_file
        restart, self._started = self._started, True
        self.proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                     cwd=str(REPO), preexec_fn=die_with_parent())
        if self.echo:
            quiet = () if cuda_device_present() else WITHOUT_CUDA
            self._tee = LogTee(self.proc.stdout, self.log_path, append=restart, quiet=quiet).start()
        return self

    def log_tail(self, lines: int = 60) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def tail_note(self) -> str:
        """For an error message: the log's tail (unless it was echoed above), then its first model-load error."""
        if self._tee is not None and self.proc is not None and self.proc.poll() is not None:
            self._tee.join(timeout=5.0)     # the exited server's last lines first
        if self.log_path is None or not self.log_path.is_file():
            return " (the server's log is above)"
        note = f" (its log is above and in {self.log_path})" if self.echo else \
            f"\n--- server log tail ---\n{self.log_tail()}"
        error = first_load_error(self.log_path.read_text(errors="replace"))
        return note + (f"\n{error.describe()}" if error is not None else "")

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://localhost:{self.ports.http}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, OSError):
            return False

    def wait_ready(self, timeout: float = 180.0) -> None:
        """Block until /v2/health/ready answers 200; raise with the log tail if the server dies or times out."""
        self.wait_until(self.is_ready, timeout, interval=0.5)

    def stop(self, timeout: float = 30.0, signum: int = signal.SIGINT) -> int | None:
        """``signum`` (SIGINT or SIGTERM: Triton's graceful shutdown), then SIGKILL of the process group after
        ``timeout``."""
        proc, self.proc = self.proc, None
        code = None
        if proc is not None:
            code = stop_process(proc, signum, timeout)
            # Python backend stubs live in the server's process group; reap any stragglers.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self._tee is not None:
            self._tee.join(timeout=5.0)
            self._tee = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return code
