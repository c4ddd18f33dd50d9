"""The Triton weight-only GEMV, interpreted on CPU in a fresh process (TRITON_INTERPRET must precede triton)."""
from pathlib import Path

from tests.backend.attention.test_triton_kernels import run_isolated

HERE = Path(__file__).resolve().parent


def test_quant_gemv_under_interpreter():
    res = run_isolated(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", str(HERE / "quant_triton_cases.py")],
                       {"TRITON_INTERPRET": "1"}, timeout=300)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert " passed" in res.stdout and "failed" not in res.stdout
