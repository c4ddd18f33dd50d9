"""cli/launcher.py and the model repository's wiring (no server started here)."""
from __future__ import annotations

import os
import re
import stat
import sys

import pytest

from preprocess.request import KNOWN_INPUTS
from cli.client import INPUT_TYPES, OUTPUTS
from cli.serve import parse_overrides
from cli.launcher import (
    MODEL_REPOSITORY,
    LauncherError,
    Ports,
    find_tritonserver,
    free_ports,
    prepare_pytriton_backends,
    render_model_repository,
    set_parameters,
)

TYPE_NAMES = {"TYPE_STRING": "BYTES", "TYPE_INT32": "INT32", "TYPE_UINT64": "UINT64", "TYPE_FP32": "FP32",
              "TYPE_BOOL": "BOOL", "TYPE_FP16": "FP16"}
LLM_INPUTS = {"lora_task_id", "lora_weights", "lora_config"}   # routed by the ensemble straight to the llm model


def io_block(model: str, kind: str) -> dict[str, tuple[str, str, bool]]:
    """{name: (type, dims, optional)} of a config.pbtxt's input or output block."""
    text = (MODEL_REPOSITORY / model / "config.pbtxt").read_text()
    block = re.search(rf"^{kind} \[\n(.*?)^\]", text, re.S | re.M).group(1)
    out = {}
    for m in re.finditer(r'name: "(\w+)"\s+data_type: (\w+)\s+dims: \[ ([-\d, ]+) \]( optional: true)?', block):
        out[m.group(1)] = (m.group(2), m.group(3).strip(), bool(m.group(4)))
    return out


def test_ensemble_speaks_tensorrt_llm_names_and_types():
    inputs = io_block("ensemble", "input")
    assert {k: TYPE_NAMES[v[0]] for k, v in inputs.items()} == INPUT_TYPES
    # all optional: preprocess answers a missing text_input / max_tokens with an error naming it, where
    # Triton 2.51's decoupled ensemble would end the stream silently (docs/serving.md)
    required = sorted(k for k, v in inputs.items() if not v[2])
    assert required == []
    assert inputs["seed"][0] == "TYPE_UINT64" and inputs["stop_words"][1] == "-1"
    assert list(io_block("ensemble", "output")) == list(OUTPUTS)


def test_preprocess_accepts_every_ensemble_input_and_postprocess_makes_every_output():
    ensemble = io_block("ensemble", "input")
    assert io_block("preprocess", "input") == {k: v for k, v in ensemble.items() if k not in LLM_INPUTS}
    assert set(ensemble) - {"stop"} - LLM_INPUTS <= KNOWN_INPUTS
    assert {k: v for k, v in io_block("llm", "input").items() if k in LLM_INPUTS} == \
        {k: v for k, v in ensemble.items() if k in LLM_INPUTS}
    assert io_block("postprocess", "output") == io_block("ensemble", "output")


def test_ensemble_steps_connect():
    text = (MODEL_REPOSITORY / "ensemble" / "config.pbtxt").read_text()
    for model, kind in (("llm", "input"), ("llm", "output"), ("postprocess", "input")):
        for name in io_block(model, kind):
            assert f'key: "{name}"' in text, (model, name)
    assert "decoupled: true" in (MODEL_REPOSITORY / "llm" / "config.pbtxt").read_text()
    assert "decoupled: true" in text
    for model in ("preprocess", "llm", "postprocess"):
        assert (MODEL_REPOSITORY / model / "1" / "model.py").is_file()
        assert len((MODEL_REPOSITORY / model / "1" / "model.py").read_text().splitlines()) < 100
    assert (MODEL_REPOSITORY / "ensemble" / "1").is_dir()


def test_llm_defaults_point_at_the_demo_model():
    text = (MODEL_REPOSITORY / "llm" / "config.pbtxt").read_text()
    assert 'key: "model_path" value: { string_value: "models/demo-target" }' in text


def test_set_parameters_replaces_and_adds():
    text = 'parameters { key: "model_path" value: { string_value: "models/demo-target" } }\n'
    out = set_parameters(text, {"model_path": "/tmp/x y", "kv_cache_bytes": "4MiB"})
    assert 'key: "model_path" value: { string_value: "/tmp/x y" }' in out
    assert 'key: "kv_cache_bytes" value: { string_value: "4MiB" }' in out
    assert "demo-target" not in out


def test_render_model_repository_applies_overrides(tmp_path):
    repo = render_model_repository(tmp_path / "repo", {"llm": {"model_path": "/ckpt"}})
    assert '"/ckpt"' in (repo / "llm" / "config.pbtxt").read_text()
    assert (repo / "ensemble" / "1").is_dir() and (repo / "postprocess" / "1" / "model.py").is_file()
    with pytest.raises(LauncherError, match="unknown models"):
        render_model_repository(tmp_path / "repo2", {"nope": {"a": "b"}})


def test_ports_from_env():
    assert Ports.from_env({}) == Ports(8000, 8001, 8002)
    assert Ports.from_env({"GRPC_PORT": "9001"}).grpc == 9001
    with pytest.raises(LauncherError, match="HTTP_PORT"):
        Ports.from_env({"HTTP_PORT": "http"})
    with pytest.raises(LauncherError, match="METRICS_PORT"):
        Ports.from_env({"METRICS_PORT": "70000"})
    p = Ports.free()
    assert len({p.http, p.grpc, p.metrics}) == 3
    # picked together, never the same port twice (one at a time, a just-released port can come back)
    assert all(len(set(free_ports(3))) == 3 for _ in range(200))


def _fake_binary(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_find_tritonserver_order(tmp_path):
    explicit = _fake_binary(tmp_path / "opt" / "tritonserver" / "bin" / "tritonserver")
    (tmp_path / "opt" / "tritonserver" / "backends").mkdir()
    found = find_tritonserver({"TRITONSERVER": str(explicit), "PATH": ""}, cache=tmp_path / "cache")
    assert found.binary == explicit and found.source == "$TRITONSERVER"
    assert found.backend_dir == tmp_path / "opt" / "tritonserver" / "backends"
    with pytest.raises(LauncherError, match="TRITONSERVER"):
        find_tritonserver({"TRITONSERVER": str(tmp_path / "missing")})
    on_path = _fake_binary(tmp_path / "bin" / "tritonserver")
    found = find_tritonserver({"PATH": str(tmp_path / "bin")}, cache=tmp_path / "cache")
    assert found.binary == on_path and found.source == "PATH"
    assert found.env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)


def test_pytriton_bundle_gets_the_stub_for_this_python(tmp_path):
    found = find_tritonserver({"PATH": ""}, cache=tmp_path / "cache")  # the venv has nvidia-pytriton
    assert found.source == "nvidia-pytriton"
    stub = found.backend_dir / "python" / "triton_python_backend_stub"
    assert stub.is_file() and (found.backend_dir / "python" / "libtriton_python.so").is_file()
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in str(found.backend_dir)
    assert "nvidia_pytriton.libs" in found.env["LD_LIBRARY_PATH"]
    assert str(MODEL_REPOSITORY.parent) in found.env["PYTHONPATH"].split(os.pathsep)
    again = prepare_pytriton_backends(found.binary.parent.parent, cache=tmp_path / "cache")
    assert again == found.backend_dir


def test_serve_overrides():
    assert parse_overrides(["llm.model_path=/x", "llm.block_size=32", "preprocess.tokenizer_path=/t"]) == {
        "llm": {"model_path": "/x", "block_size": "32"}, "preprocess": {"tokenizer_path": "/t"}}
    with pytest.raises(LauncherError, match="MODEL.PARAMETER=VALUE"):
        parse_overrides(["model_path=/x"])


def test_bad_set_leaves_no_rendered_repository(tmp_path, monkeypatch, capsys):
    import cli.serve as serve
    monkeypatch.setattr(serve, "CACHE", tmp_path)
    assert serve.main(["--set", "nosuch.model_path=/x"]) == 2
    assert "--set names unknown models ['nosuch']; the models are ['ensemble', 'llm', 'postprocess', " \
           "'preprocess']" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_errors_before_ready_say_where_the_log_is(tmp_path):
    from cli.launcher import TritonServer
    to_terminal = TritonServer(MODEL_REPOSITORY)
    assert to_terminal.tail_note() == " (the server's log is above)"
    log = tmp_path / "server.log"
    log.write_text("line 1\nE boom\n")
    assert to_terminal.log_tail() == "" and "boom" in TritonServer(MODEL_REPOSITORY, log_path=log).tail_note()


def test_cpu_start_has_no_pinned_memory_pool(monkeypatch, tmp_path):
    import cli.launcher as tl
    server = tl.TritonServer(MODEL_REPOSITORY, install=tl.TritonInstall(tmp_path / "tritonserver", None))
    monkeypatch.setattr(tl, "cuda_device_present", lambda: False)
    assert "--pinned-memory-pool-byte-size=0" in server.command()
    monkeypatch.setattr(tl, "cuda_device_present", lambda: True)
    assert not any(a.startswith("--pinned-memory-pool") for a in server.command())
