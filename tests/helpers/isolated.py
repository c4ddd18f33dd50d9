"""Tests that run in a fresh Python process: Triton kernels under ``TRITON_INTERPRET=1`` (it must be set
before triton is imported, so never in the test process itself) and the GPU check scripts."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_isolated(args: list[str], env_update: dict, timeout: int) -> subprocess.CompletedProcess:
    """``python *args`` from the repository root, without this process's ``TRITON_INTERPRET``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(env_update)
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def assert_interpreted_cases_pass(cases: Path, timeout: int) -> None:
    """Every test in the file ``cases`` passes under the Triton interpreter, in a fresh process."""
    res = run_isolated(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", str(cases)],
                       {"TRITON_INTERPRET": "1"}, timeout=timeout)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert " passed" in res.stdout and "failed" not in res.stdout
