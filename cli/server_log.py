"""tritonserver's log as the launcher handles it: kept whole in a file, echoed, and why a model failed to load.

``LogTee`` copies the server's output (its own log and its Python models', one pipe) line by line into the log
file and to the terminal. On a machine without an NVIDIA device it leaves out of the echo, never out of the file,
the two ``E`` lines the CUDA build of tritonserver logs there although nothing is wrong (``WITHOUT_CUDA``; docs/
serving.md, "Known Triton 2.51 issues").

``first_load_error`` finds the first model-load failure in a log (``failed to load 'llm' version 1: ...``, or a
model directory Triton could not read), with the Python exception text a model's ``initialize`` raised, so the
launcher can repeat it after the 70-odd lines of tables and shutdown that follow it; failing that, the first
``E`` line that is not one of the harmless ones.
"""
from __future__ import annotations

import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

MAX_LOG_BYTES = 64 * 2**20

# Harmless on a CPU-only machine: the CUDA build probing for a driver, and the ensemble's optional CUDA stream.
WITHOUT_CUDA = ('"CudaDriverHelper has not been initialized."',
                '"unable to create stream for ensemble: CUDA driver version is insufficient for CUDA runtime version"')

# Triton's default log prefix (``E1207 14:51:55.292181 4848 file.cc:642] ``) or ISO8601's (``2024-12-07T14:51:55Z E
# 4848 file.cc:642] ``), then the message, quoted with escapes.
_LINE = re.compile(r"^(?:(?P<level>[IWE])\d{4} \S+|\S+ (?P<iso_level>[IWE])) +\d+ \S+:\d+\] (?P<message>.*)$")
_FAILED_LOAD = re.compile(r"failed to load '(?P<model>[^']+)' version \d+: (?P<why>.+)", re.S)
_POLL_FAILED = re.compile(r"Poll failed for model directory '(?P<model>[^']+)': (?P<why>.+)", re.S)
_TRACEBACK = "\n\nAt:\n"    # where the Python backend appends the traceback of a model's exception


@dataclass(frozen=True)
class LoadError:
    """Why the server did not come up: a model's load failure (``model`` set), or else the first error line."""

    model: str | None
    message: str

    def describe(self) -> str:
        if self.model is None:
            return f"the first error in tritonserver's log: {self.message}"
        return f"the model '{self.model}' failed to load: {self.message}"


def _unquote(message: str) -> str:
    """A log message as Triton quoted it (``"...\\n..."``) back to its text."""
    message = message.strip()
    if len(message) >= 2 and message[0] == message[-1] == '"':
        return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), message[1:-1])
    return message


def error_messages(text: str) -> list[str]:
    """The messages of the ``E`` lines of a tritonserver log, unquoted, in order."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and "E" in (m.group("level"), m.group("iso_level")):
            out.append(_unquote(m.group("message")))
    return out


def first_load_error(text: str) -> LoadError | None:
    """The first model-load failure in a tritonserver log (else its first error that is not a harmless CUDA line),
    without the Python traceback; None when it has no error."""
    messages = error_messages(text)
    for message in messages:
        m = _FAILED_LOAD.match(message) or _POLL_FAILED.match(message)
        if m:
            why = m.group("why").split(_TRACEBACK, 1)[0].strip()
            return LoadError(m.group("model"), why.removeprefix("Internal: "))
    harmless = {_unquote(line) for line in WITHOUT_CUDA}
    rest = [message for message in messages if message not in harmless]
    return LoadError(None, rest[0].split(_TRACEBACK, 1)[0].strip()) if rest else None


class LogTee:
    """A thread copying ``source`` (the server's stdout pipe) into the file ``path`` and, less the lines that contain
    one of ``quiet``, to ``echo`` (default: ``sys.stdout`` when started). The file starts empty unless ``append`` (a
    restart); past ``max_bytes`` it becomes ``<path>.1`` (replacing the one before) and a new file starts, so a
    long-running server's log (a line per request) stays within twice that. Ends at the pipe's end."""

    def __init__(self, source: BinaryIO, path: Path, *, append: bool = False, echo: TextIO | None = None,
                 quiet: tuple[str, ...] = (), max_bytes: int = MAX_LOG_BYTES):
        self.source, self.path, self.echo, self.quiet, self.max_bytes = source, path, echo, quiet, max_bytes
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.path, "ab" if append else "wb")
        self._thread = threading.Thread(target=self._run, name="tritonserver-log", daemon=True)

    def start(self) -> "LogTee":
        self.echo = self.echo or sys.stdout
        self._thread.start()
        return self

    def _write(self, line: bytes) -> None:
        if self._log is None:
            return
        try:
            self._log.write(line)
            self._log.flush()
            if self._log.tell() > self.max_bytes:
                self._log.close()
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                self._log = open(self.path, "wb")
        except OSError as e:        # a full disk: the server goes on, echoed, without its file
            print(f"tritonserver log: no longer written to {self.path}: {e}", file=sys.stderr)
            self._log = None

    def _echo(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace")
        if self.echo is None or any(q in text for q in self.quiet):
            return
        try:
            self.echo.write(text)
            self.echo.flush()
        except (OSError, ValueError):   # the terminal went away: keep draining the pipe, or the server would block
            self.echo = None

    def _run(self) -> None:
        try:
            for line in iter(self.source.readline, b""):
                self._write(line)
                self._echo(line)
        finally:
            self.source.close()
            if self._log is not None:
                self._log.close()

    def join(self, timeout: float) -> None:
        """Wait until everything the server wrote so far is copied (the pipe's end), at most ``timeout`` seconds."""
        self._thread.join(timeout)
