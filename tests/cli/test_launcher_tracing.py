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
        "http://j:4318/v1/traces as 'triton-llm', 1 request in 10, sent within 5000 ms"
    assert tracing_summary({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://j:4318", "OTEL_TRACES_SAMPLER": "always_off"}) \
        .endswith("none sampled")
    assert tracing_summary({"OTEL_EXPORTER_OTLP_ENDPOINT": "x"}).startswith("off (OTEL_EXPORTER_OTLP_ENDPOINT")


@pytest.mark.parametrize("env, delay", [
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318"}, "1000"),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, "1000"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1]:4318"}, "1000"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger.monitoring:4318"}, None),        # a remote collector
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318", "OTEL_BSP_SCHEDULE_DELAY": "3000"}, None),  # its own
    ({}, None),
])
def test_traces_to_this_machine_are_sent_within_a_second(env, delay):
    from cli.serve import local_trace_env

    assert local_trace_env(env).get("OTEL_BSP_SCHEDULE_DELAY") == delay


def test_the_local_delay_reaches_tritonservers_flags(monkeypatch):
    from cli.serve import local_trace_env

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_BSP_SCHEDULE_DELAY", raising=False)
    server = TritonServer(Path("/repo"), Ports(), install=TritonInstall(Path("/bin/tritonserver"), None),
                          env=local_trace_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318"}))
    assert "opentelemetry,bsp_schedule_delay=1000" in flags(server.command()[server.command().index("--trace-config"):])
    assert server.server_env()["OTEL_BSP_SCHEDULE_DELAY"] == "1000"     # the Python models' exporters too
