"""The Makefile's targets (dry runs): `make serve` fetches no helm, `make test` does, `make install`
builds the native kernels."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def dry_run(target: str, tmp_path: Path) -> str:
    if shutil.which("make") is None:
        pytest.skip("no make")
    # VENV in a fresh folder: every step of the recipe shows, whatever this checkout has installed
    out = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_serve_fetches_no_helm(tmp_path):
    out = dry_run("serve", tmp_path)
    assert "-m cli.serve" in out and "fetch_helm" not in out


def test_test_fetches_helm(tmp_path):
    out = dry_run("test", tmp_path)
    assert "-m tools.fetch_helm" in out and out.index("fetch_helm") < out.index("-m pytest")


def test_install_builds_the_native_kernels(tmp_path):
    out = dry_run("install", tmp_path)
    assert "-m backend.native.build" in out and "fetch_helm" not in out
