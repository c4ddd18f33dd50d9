"""`make serve` (python -m cli.serve) with an unknown parameter in each model stops before it reports ready,
and its output names each key and its model. One tritonserver start covers the three models, `--set` and
`$TRITON_LLM_SET` (each model's refusal is unit-tested in tests/contracts/test_model_parameters.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cli.launcher import REPO, Ports

REFUSED = {   # model -> (key, how it arrives)
    "llm": ("kv_cache_free_gpu_mem_fraction", "env"),
    "preprocess": ("no_such_preprocess_setting", "flag"),
    "postprocess": ("no_such_postprocess_setting", "flag"),
}


@pytest.mark.e2e
@pytest.mark.slow
def test_unknown_parameters_stop_make_serve_naming_each_key_and_model(tmp_path):
    ports = Ports.free()
    env = dict(os.environ, HTTP_PORT=str(ports.http), GRPC_PORT=str(ports.grpc), METRICS_PORT=str(ports.metrics),
               TRITON_LLM_SET=" ".join(f"{m}.{k}=0.9" for m, (k, how) in REFUSED.items() if how == "env"),
               TRITON_LLM_SERVER_ARGS="--exit-timeout-secs=10")
    flags = [a for m, (k, how) in REFUSED.items() if how == "flag" for a in ("--set", f"{m}.{k}=1")]
    proc = subprocess.run([sys.executable, "-m", "cli.serve", "--no-gateway", *flags], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    assert "ready:" not in proc.stdout, out[-4000:]
    for model, (key, _) in REFUSED.items():
        assert f"{key}: not a parameter of the {model} model (" in out, f"{model}.{key} not named:\n{out[-6000:]}"
    assert "TensorRT-LLM's name; set llm.gpu_memory_utilization or llm.kv_cache_bytes" in out, out[-4000:]
    # the launcher's last lines repeat the first model-load error: one of the three, with its key and model
    tail = "\n".join(out.strip().splitlines()[-5:])
    assert any(f"{key}: not a parameter of the {model} model" in tail for model, (key, _) in REFUSED.items()), (
        f"the launcher's last lines name no refused parameter:\n{tail}")
