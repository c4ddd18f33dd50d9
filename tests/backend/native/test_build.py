"""backend/native/build.py: the build key, the log line before a build at run time, and
``python -m backend.native.build`` (what ``make install`` runs)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from backend.native import build

REPO = build.REPO
# native_ops() with torch's JIT builder replaced by a stand-in that prints LOAD: what is logged, and when. Logging
# is left unconfigured, as in a Triton model's stub, whose stderr goes to the server's log.
SCRIPT = """
import sys
import torch.utils.cpp_extension as ext
ext.load = lambda **kw: print("LOAD", file=sys.stderr, flush=True)
from backend.native.build import native_ops
print("available" if native_ops().available else native_ops().reason, file=sys.stderr)
"""


def run_with_fake_load(cache, *extra_env):
    env = {**os.environ, "TRITON_LLM_CACHE_DIR": str(cache), "TRITON_LLM_NATIVE": "1"}
    return subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120).stderr


def test_the_key_covers_contents_and_paths(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "x.cpp").write_text("int x;")
    assert build.build_key([a / "x.cpp"]) == build.build_key([a / "x.cpp"])
    assert build.build_key([a / "x.cpp"]) != build.build_key([b / "x.cpp"])   # another checkout: its own dir
    key = build.build_key([a / "x.cpp"])
    (a / "x.cpp").write_text("int y;")
    assert build.build_key([a / "x.cpp"]) != key


def test_a_build_at_run_time_is_announced_before_it_starts(tmp_path):
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler: native_ops() does not try a build")
    err = run_with_fake_load(tmp_path).splitlines()
    assert "LOAD" in err and "available" in err, err
    said = [i for i, line in enumerate(err) if line.startswith("compiling the native CPU kernels")]
    assert said and said[0] < err.index("LOAD"), err
    assert build.BUILD_ESTIMATE in err[said[0]]
    # once the library is there, loading it says nothing
    (build_dir,) = (tmp_path / "native").iterdir()
    (build_dir / f"{build.LIBRARY}_native.so").write_bytes(b"")
    err = run_with_fake_load(tmp_path).splitlines()
    assert "LOAD" in err and not any(line.startswith("compiling") for line in err), err


def test_the_make_install_step_is_a_no_op_when_disabled():
    env = {**os.environ, "TRITON_LLM_NATIVE": "0"}
    out = subprocess.run([sys.executable, "-m", "backend.native.build"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "disabled by TRITON_LLM_NATIVE=0" in out.stderr and "RuntimeWarning" not in out.stderr
