"""tritonserver's log through the launcher (cli/server_log.py): the first model-load error is repeated at the end,
whatever the model; the harmless CUDA lines of a CPU-only start stay out of the echo and in the log file. Parsed
from a captured log, from a fake server, and from a real tritonserver refusing a checkpoint."""
from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import cli.launcher as launcher
from backend.model.config import SUPPORTED_ARCHITECTURES
from cli.launcher import REPO, LauncherError, Ports, TritonInstall, TritonServer, free_ports
from cli.server_log import WITHOUT_CUDA, LogTee, LoadError, error_messages, first_load_error

CAPTURED = Path(__file__).parent / "data" / "tritonserver_unsupported_checkpoint.log"
UNSUPPORTED = ("CheckpointError: /models/gpt2/config.json: unsupported architectures ['GPT2LMHeadModel']; "
               "supported: ['LlamaForCausalLM', 'MistralForCausalLM', 'Qwen2ForCausalLM']")


def test_the_captured_load_failure_names_the_model_and_the_exception_without_its_traceback():
    error = first_load_error(CAPTURED.read_text())
    assert error == LoadError("llm", UNSUPPORTED)
    assert error.describe() == f"the model 'llm' failed to load: {UNSUPPORTED}"


def test_any_model_and_triton_s_other_forms():
    log = ('I1207 14:51:47.9 1 model_lifecycle.cc:472] "loading: preprocess:1"\n'
           'E1207 14:51:48.1 1 model_lifecycle.cc:642] "failed to load \'preprocess\' version 1: Internal: '
           'ValueError: preprocess: unknown parameter \'max_promt_bytes\' in config.pbtxt\\n\\nAt:\\n  x.py(1): f\\n"\n'
           'E1207 14:51:49.1 1 model_lifecycle.cc:642] "failed to load \'llm\' version 1: Internal: later"\n')
    assert first_load_error(log) == LoadError("preprocess", "ValueError: preprocess: unknown parameter "
                                                            "'max_promt_bytes' in config.pbtxt")
    poll = ('E1207 10:00:00.0 1 model_repository_manager.cc:1400] "Poll failed for model directory \'llm\': '
            'failed to read text proto from /r/llm/config.pbtxt"\n')
    assert first_load_error(poll) == LoadError("llm", "failed to read text proto from /r/llm/config.pbtxt")
    iso = ('2024-12-07T10:00:00Z E 1 model_lifecycle.cc:642] "failed to load \'llm\' version 1: '
           'Invalid argument: \\"quoted\\" text"\n')
    assert first_load_error(iso) == LoadError("llm", 'Invalid argument: "quoted" text')


def test_without_a_load_failure_the_first_error_that_is_not_a_harmless_cuda_line():
    cuda = [f'E1207 10:00:00.0 1 server.cc:241] {WITHOUT_CUDA[0]}',
            f'E1207 10:00:01.0 1 ensemble_scheduler.cc:1468] {WITHOUT_CUDA[1]}']
    assert first_load_error("\n".join(cuda)) is None
    port = 'E1207 10:00:02.0 1 main.cc:245] "failed to start HTTP service: Address already in use"'
    assert first_load_error("\n".join(cuda + ["I1207 10:00:01.5 1 x.cc:1] \"fine\"", port])) == \
        LoadError(None, "failed to start HTTP service: Address already in use")
    assert len(error_messages(CAPTURED.read_text())) == 4


def test_the_tee_keeps_every_line_in_the_log_and_echoes_all_but_the_quiet_ones(tmp_path):
    lines = [b"I first\n", f"E1207 1 2 server.cc:241] {WITHOUT_CUDA[0]}\n".encode(), "I caf\u00e9\n".encode()]
    read, write = os.pipe()
    with os.fdopen(write, "wb") as w:
        w.write(b"".join(lines))
    echo = io.StringIO()
    LogTee(os.fdopen(read, "rb"), tmp_path / "log", echo=echo, quiet=WITHOUT_CUDA).start().join(timeout=10)
    assert (tmp_path / "log").read_bytes() == b"".join(lines)
    assert echo.getvalue() == "I first\nI caf\u00e9\n"


def test_a_long_log_turns_over_into_one_previous_file(tmp_path):
    read, write = os.pipe()
    with os.fdopen(write, "wb") as w:
        w.write(b"".join(b"line %03d\n" % i for i in range(100)))    # 9 bytes a line
    LogTee(os.fdopen(read, "rb"), tmp_path / "log", echo=io.StringIO(), max_bytes=200).start().join(timeout=10)
    kept = (tmp_path / "log.1").read_text() + (tmp_path / "log").read_text()
    assert kept.splitlines() == [f"line {i:03d}" for i in range(100 - len(kept.splitlines()), 100)]
    assert 200 < len(kept) <= 2 * 200 + 9 and len(list(tmp_path.iterdir())) == 2


FAKE_LOG = "\n".join([
    'I1207 14:51:47.9 1 server.cc:1] "starting"',
    'E1207 14:51:47.9 1 server.cc:241] "CudaDriverHelper has not been initialized."',
    'E1207 14:51:55.2 1 model_lifecycle.cc:642] "failed to load \'postprocess\' version 1: Internal: '
    'KeyError: \'boom\'\\n\\nAt:\\n  /r/postprocess/1/model.py(9): initialize\\n"',
    *(f'I1207 14:51:56.0 1 server.cc:345] "table line {i}"' for i in range(70)),
    "error: creating server: Internal - failed to load all models", ""])


@pytest.mark.parametrize("cuda", [False, True])
def test_a_server_that_exits_before_ready_ends_with_its_first_load_error(tmp_path, monkeypatch, capsys, cuda):
    (tmp_path / "output").write_text(FAKE_LOG)
    fake = tmp_path / "tritonserver"
    fake.write_text(f"#!/bin/sh\ncat {tmp_path / 'output'}\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(launcher, "cuda_device_present", lambda: cuda)
    log = tmp_path / "server.log"
    server = TritonServer(tmp_path, Ports(*free_ports(3)), install=TritonInstall(fake, None), log_path=log, echo=True)
    server.start()
    try:
        with pytest.raises(LauncherError) as e:
            server.wait_ready(timeout=30)
    finally:
        server.stop()
    message = str(e.value)
    assert message.startswith("tritonserver exited with code 1 before becoming ready")
    assert message.splitlines()[-1] == "the model 'postprocess' failed to load: KeyError: 'boom'"
    echoed = capsys.readouterr().out
    assert "table line 69" in echoed and "failed to load all models" in echoed   # the whole log came first
    assert ("CudaDriverHelper" in echoed) == cuda
    assert "CudaDriverHelper" in log.read_text() and "table line 69" in log.read_text()


def unsupported_checkpoint(dest: Path) -> Path:
    """The demo checkpoint with a config.json naming an architecture the engine does not implement."""
    shutil.copytree(REPO / "models" / "demo-target", dest)
    config = json.loads((dest / "config.json").read_text())
    config.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    (dest / "config.json").write_text(json.dumps(config))
    return dest


@pytest.mark.e2e
def test_serve_repeats_why_a_real_checkpoint_failed_to_load(tmp_path):
    ckpt = unsupported_checkpoint(tmp_path / "gpt2")
    http, grpc, metrics = free_ports(3)
    env = {**os.environ, "HTTP_PORT": str(http), "GRPC_PORT": str(grpc), "METRICS_PORT": str(metrics)}
    log = tmp_path / "tritonserver.log"
    out = subprocess.run([sys.executable, "-m", "cli.serve", "--no-gateway", "--log-file", str(log),
                          "--set", f"llm.model_path={ckpt}"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last == (f"the model 'llm' failed to load: CheckpointError: {ckpt}/config.json: unsupported architectures "
                    f"['GPT2LMHeadModel']; supported: {sorted(SUPPORTED_ARCHITECTURES)}")
    assert "failed to load all models" in out.stdout     # echoed above it
    if not launcher.cuda_device_present():
        assert "CudaDriverHelper" not in out.stdout and "CudaDriverHelper" in log.read_text()
