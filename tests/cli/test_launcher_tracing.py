"""The launcher honours the OTEL_* environment: tritonserver's trace flags, and the environment its
Python models inherit (cli/launcher.py, cli/serve.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from cli.serve import tracing_summary
from cli.launcher import LauncherError, Ports, TritonInstall, TritonServer, otel_trace_args


def flags(args: list[str]) -> list[str]:
    assert args[::2] == ["--trace-config"] * (len(args) // 2)
    return args[1::2]


def test_no_endpoint_no_trace_flags():
    assert otel_trace_args({}) == []
    assert otel_trace_args({"OTEL_TRACES_SAMPLER": "always_on"}) == []


def test_endpoint_turns_on_tritons_opentelemetry_mode():
    f = flags(otel_trace_args({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318",
                               "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5",
                               "OTEL_SERVICE_NAME": "chat"}))
    assert f[:5] == ["mode=opentelemetry", "opentelemetry,url=http://localhost:4318/v1/traces", "level=TIMESTAMPS",
                     "rate=2", "count=-1"]
    assert "opentelemetry,resource=service.name=chat" in f


def test_bad_value_is_a_launcher_error_naming_the_variable():
    with pytest.raises(LauncherError, match="^OTEL_TRACES_SAMPLER_ARG"):
        otel_trace_args({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_SAMPLER": "traceidratio",
                         "OTEL_TRACES_SAMPLER_ARG": "2"})


def test_server_command_and_environment_carry_the_tracing(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    install = TritonInstall(Path("/bin/tritonserver"), None, {"PATH": "/venv/bin"})
    plain = TritonServer(Path("/repo"), Ports(1, 2, 3), install=install)
    assert "--trace-config" not in plain.command()
    traced = TritonServer(Path("/repo"), Ports(1, 2, 3), install=install, extra_args=["--exit-timeout-secs=5"],
                          env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9999"})
    cmd = traced.command()
    assert cmd[-1] == "--exit-timeout-secs=5"
    assert "opentelemetry,url=http://127.0.0.1:9999/v1/traces" in cmd
    env = traced.server_env()
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:9999"   # the Python models read it
    assert env["PATH"] == "/venv/bin"


def test_serve_prints_where_traces_go():
    assert tracing_summary({}).startswith("off (set OTEL_EXPORTER_OTLP_ENDPOINT")
    assert tracing_summary({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://j:4318",
                            "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}) == \
        "http://j:4318/v1/traces as 'triton-llm', 1 request in 10"
    assert tracing_summary({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://j:4318", "OTEL_TRACES_SAMPLER": "always_off"}) \
        .endswith("none sampled")
    assert tracing_summary({"OTEL_EXPORTER_OTLP_ENDPOINT": "x"}).startswith("off (OTEL_EXPORTER_OTLP_ENDPOINT")
