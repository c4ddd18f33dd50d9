"""The Triton attention kernels: interpreted on CPU (in a fresh process), compiled on CUDA."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


def run_isolated(args: list[str], env_update: dict, timeout: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(env_update)
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_kernels_under_interpreter():
    """Every case in triton_interpret_cases.py (GQA 1/4/8, block 16/32, fp32/fp16, split-K)."""
    res = run_isolated(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", str(HERE / "triton_interpret_cases.py")],
                       {"TRITON_INTERPRET": "1"}, timeout=300)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert " passed" in res.stdout and "failed" not in res.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (compiled kernels)")
def test_compiled_kernels_on_gpu():
    res = run_isolated([str(HERE / "gpu_attention_check.py")], {}, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
