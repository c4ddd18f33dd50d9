"""The start banner's client command works from a plain shell (no virtual environment on PATH)."""
from __future__ import annotations

import shlex
import subprocess

from cli.launcher import REPO
from cli.serve import client_command


def test_the_venv_script_relative_to_the_repository(tmp_path):
    bindir = tmp_path / ".venv" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "python").write_text("")
    (bindir / "llm-client").write_text("")
    assert client_command(str(bindir / "python"), cwd=tmp_path) == ".venv/bin/llm-client"
    assert client_command(str(bindir / "python"), cwd=tmp_path / "elsewhere") == str(bindir / "llm-client")


def test_without_the_script_this_interpreter_runs_the_module(tmp_path):
    (tmp_path / "python").write_text("")
    assert client_command(str(tmp_path / "python"), cwd=tmp_path) == "python -m cli.client"


def test_the_suggested_command_runs_from_a_plain_shell():
    command = client_command(cwd=REPO)
    out = subprocess.run(["/bin/sh", "-c", f"{command} --help"], cwd=REPO, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--gateway" in out.stdout
    assert not shlex.split(command)[0].startswith("python"), command   # not a bare `python` off PATH
