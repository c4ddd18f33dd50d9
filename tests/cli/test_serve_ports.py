"""``make serve`` refuses two servers on one port before it starts anything, naming both variables, and honours
the gateway's GATEWAY_LISTEN / OPENAI_LISTEN as ``python -m gateway`` does (cli/serve_ports.py)."""
from __future__ import annotations

import stat

import pytest

from cli.launcher import LauncherError, Ports
from cli.serve import main
from cli.serve_ports import check_distinct, gateway_listen_from_env


def test_the_defaults_are_distinct():
    listen = gateway_listen_from_env({})
    assert (listen.grpc.address, listen.openai.address) == ("0.0.0.0:50051", "0.0.0.0:9000")
    check_distinct(Ports(), listen)


def test_the_documented_alternative_ports_collide_with_the_openai_default():
    ports = Ports.from_env({"HTTP_PORT": "9000", "GRPC_PORT": "9001", "METRICS_PORT": "9002"})
    with pytest.raises(LauncherError, match=r"HTTP_PORT and OPENAI_PORT are both 9000.*OPENAI_PORT=9003"):
        check_distinct(ports, gateway_listen_from_env({}))
    env = {"OPENAI_PORT": "9003"}
    check_distinct(ports, gateway_listen_from_env(env))
    check_distinct(ports, None)   # --no-gateway: only tritonserver's three


@pytest.mark.parametrize("env, message", [
    ({"GRPC_PORT": "8000"}, "HTTP_PORT and GRPC_PORT are both 8000"),
    ({"METRICS_PORT": "8001"}, "GRPC_PORT and METRICS_PORT are both 8001"),
    ({"GATEWAY_PORT": "8002"}, "METRICS_PORT and GATEWAY_PORT are both 8002"),
    ({"OPENAI_PORT": "50051"}, "GATEWAY_PORT and OPENAI_PORT are both 50051"),
    ({"OPENAI_LISTEN": "127.0.0.1:8001"}, "GRPC_PORT and OPENAI_LISTEN are both 8001"),
    ({"GATEWAY_LISTEN": "[::]:9000"}, "GATEWAY_LISTEN and OPENAI_PORT are both 9000"),
])
def test_every_pair_is_named(env, message):
    with pytest.raises(LauncherError, match=message.replace("[", r"\[")):
        check_distinct(Ports.from_env(env), gateway_listen_from_env(env))


def test_the_listen_variables_win_over_the_port_variables():
    listen = gateway_listen_from_env({"GATEWAY_LISTEN": "127.0.0.1:7000", "GATEWAY_PORT": "1",
                                      "OPENAI_LISTEN": "127.0.0.1:7001", "OPENAI_PORT": "2"})
    assert (listen.grpc.address, listen.openai.address) == ("127.0.0.1:7000", "127.0.0.1:7001")
    assert gateway_listen_from_env({"OPENAI_LISTEN": "off", "OPENAI_PORT": "50051"}).openai is None


@pytest.mark.parametrize("env, variable", [({"OPENAI_PORT": "http"}, "OPENAI_PORT"),
                                           ({"GATEWAY_PORT": "70000"}, "GATEWAY_PORT"),
                                           ({"OPENAI_LISTEN": "9000"}, "OPENAI_LISTEN"),
                                           ({"GATEWAY_LISTEN": "host:x"}, "GATEWAY_LISTEN")])
def test_malformed_values_are_refused_naming_the_variable(env, variable):
    with pytest.raises(LauncherError, match=f"^{variable}: "):
        gateway_listen_from_env(env)


def test_main_refuses_before_starting_tritonserver(tmp_path, monkeypatch, capsys):
    started = tmp_path / "started"
    fake = tmp_path / "tritonserver"
    fake.write_text(f"#!/bin/sh\ntouch {started}\nsleep 30\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("TRITONSERVER", str(fake))
    for name, value in {"HTTP_PORT": "9000", "GRPC_PORT": "9001", "METRICS_PORT": "9002"}.items():
        monkeypatch.setenv(name, value)
    for name in ("OPENAI_PORT", "OPENAI_LISTEN", "GATEWAY_PORT", "GATEWAY_LISTEN"):
        monkeypatch.delenv(name, raising=False)
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "HTTP_PORT and OPENAI_PORT are both 9000" in err
    assert not started.exists()
