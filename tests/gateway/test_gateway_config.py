"""Gateway flags, their environment fallbacks, and bearer-token handling (gateway/config.py)."""
from __future__ import annotations

import dataclasses
import os

import pytest

from gateway.config import ConfigError, TokenSet, from_args, read_token_file


def test_defaults():
    c = from_args([], env={})
    assert (c.listen, c.triton_url, c.triton_model) == ("0.0.0.0:50051", "localhost:8001", "ensemble")
    assert c.auth_token_file is None and c.auth_tokens == () and not c.tls
    assert (c.max_inflight, c.grace_period_s, c.max_request_bytes) == (256, 30.0, 16 * 2**20)
    assert from_args(["--max-request-bytes", "4096"], env={}).max_request_bytes == 4096
    assert from_args([], env={"GATEWAY_MAX_REQUEST_BYTES": "8192"}).max_request_bytes == 8192


def test_environment_fallbacks_and_flags_win(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("t1\n")
    env = {"GATEWAY_LISTEN": "127.0.0.1:6000", "GATEWAY_TRITON_URL": "triton:9001", "GATEWAY_AUTH_TOKEN_FILE": str(tokens),
           "GATEWAY_AUTH_TOKENS": " a , b,,", "GATEWAY_MAX_INFLIGHT": "7", "GATEWAY_GRACE_PERIOD_S": "2.5"}
    c = from_args([], env=env)
    assert (c.listen, c.triton_url, c.auth_token_file, c.auth_tokens) == ("127.0.0.1:6000", "triton:9001", tokens, ("a", "b"))
    assert (c.max_inflight, c.grace_period_s) == (7, 2.5)
    c = from_args(["--listen", "0.0.0.0:7000", "--triton-url", "x:1", "--max-inflight", "3"], env=env)
    assert (c.listen, c.triton_url, c.max_inflight) == ("0.0.0.0:7000", "x:1", 3)


def test_port_variables_shared_with_make_serve():
    c = from_args([], env={"GATEWAY_PORT": "50099", "GRPC_PORT": "9101"})
    assert (c.listen, c.triton_url) == ("0.0.0.0:50099", "localhost:9101")
    c = from_args([], env={"OPENAI_PORT": "9444", "METRICS_PORT": "9102"})
    assert (c.openai_listen, c.triton_metrics_url) == ("0.0.0.0:9444", "http://localhost:9102/metrics")
    assert from_args([], env={}).openai_listen == "0.0.0.0:9000"
    assert from_args(["--openai-listen", "off"], env={"OPENAI_LISTEN": "1.2.3.4:5"}).openai_listen is None
    assert from_args([], env={"OPENAI_LISTEN": "1.2.3.4:5"}).openai_listen == "1.2.3.4:5"


@pytest.mark.parametrize("argv, env, needle", [
    (["--tls-cert", "/nonexistent.pem"], {}, "--tls-cert and --tls-key"),
    (["--listen", "50051"], {}, "--listen"),
    (["--openai-listen", "9000"], {}, "--openai-listen"),
    (["--triton-metrics-url", "localhost:8002"], {}, "--triton-metrics-url"),
    (["--max-inflight", "0"], {}, "--max-inflight"),
    (["--max-request-bytes", "10"], {}, "--max-request-bytes"),
    (["--grace-period-s", "-1"], {}, "--grace-period-s"),
    (["--auth-token-file", "/nonexistent/tokens"], {}, "--auth-token-file"),
    ([], {"GATEWAY_MAX_INFLIGHT": "many"}, "environment"),
])
def test_bad_settings_are_named(argv, env, needle):
    with pytest.raises(ConfigError, match=needle):
        from_args(argv, env=env)


def test_token_file_format(tmp_path):
    f = tmp_path / "tokens"
    f.write_text("# comment\n\n  tok-1  \ntok-2\n")
    assert read_token_file(f) == ["tok-1", "tok-2"]


def test_token_check(tmp_path):
    f = tmp_path / "tokens"
    f.write_text("file-token\n")
    ts = TokenSet(("env-token",), f)
    assert ts.enabled
    assert ts.check("file-token") and ts.check("env-token")
    assert not ts.check("") and not ts.check("file-token ") and not ts.check("file-toke") and not ts.check("x" * 10_000)
    assert not TokenSet().enabled


def test_an_empty_token_file_rejects_everyone(tmp_path):
    f = tmp_path / "tokens"
    f.write_text("# no tokens yet\n")
    ts = TokenSet((), f)
    assert ts.enabled and not ts.check("") and not ts.check("anything")


def test_rotated_token_file_is_reread(tmp_path):
    f = tmp_path / "tokens"
    f.write_text("old\n")
    ts = TokenSet((), f, reload_interval_s=0.0)
    assert ts.check("old")
    f.write_text("new\n")
    st = f.stat()
    os.utime(f, (st.st_atime, st.st_mtime + 5))  # a distinct mtime even on coarse filesystems
    assert ts.check("new") and not ts.check("old")
    f.unlink()  # briefly missing during a rotation: the last tokens stay
    assert ts.check("new")


def test_tokens_are_compared_in_constant_time_against_every_token(monkeypatch):
    """hmac.compare_digest on fixed-length digests, once per configured token, with no early exit:
    the work done does not depend on which token (if any) matches, nor on the presented length."""
    import hmac

    from gateway import config

    calls = []
    original = hmac.compare_digest

    def counting(a, b):
        calls.append((len(a), len(b)))
        return original(a, b)

    monkeypatch.setattr(config.hmac, "compare_digest", counting)
    ts = TokenSet(("first", "second", "third"))
    for token in ("first", "third", "nope", "x" * 5000):
        calls.clear()
        ts.check(token)
        assert calls == [(32, 32)] * 3, token


def test_every_flag_is_in_the_module_table_with_its_variable():
    import gateway.config as config

    for flag in config.FLAGS:
        assert f"``{flag.name} " in config.__doc__ or f"``{flag.name}``" in config.__doc__, flag.name
        assert f"``{flag.env}``" in config.__doc__, flag.env
        assert flag.field in {f.name for f in dataclasses.fields(config.GatewayConfig)}, flag.field
