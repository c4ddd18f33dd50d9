"""cli/serve.py settings from the environment (TRITON_LLM_SET, TRITON_LLM_SERVER_ARGS), as the image
and the chart use them: parsing, and main() starting tritonserver with them (a fake binary records what
it was given)."""
from __future__ import annotations

import signal
import stat

import pytest

from cli.serve import SERVER_ARGS_ENV, SET_ENV, main, parse_overrides, settings_from_env
from cli.launcher import LauncherError


def test_unset_or_blank_is_nothing():
    assert settings_from_env({}) == ([], [])
    assert settings_from_env({SET_ENV: " \n\t", SERVER_ARGS_ENV: ""}) == ([], [])


def test_items_split_on_whitespace_and_newlines_with_shell_quoting():
    env = {SET_ENV: "llm.model_path=/models/a  llm.max_num_seqs=8\n"
                    "'preprocess.tokenizer_path=/models/my model'\n"
                    "llm.draft_model_path=\"/models/it's\"\n"
                    "'postprocess.tokenizer_path=/m/it'\"'\"'s'\n"
                    "llm.draft_model_path=\n"}
    items, args = settings_from_env(env)
    assert items == ["llm.model_path=/models/a", "llm.max_num_seqs=8", "preprocess.tokenizer_path=/models/my model",
                     "llm.draft_model_path=/models/it's", "postprocess.tokenizer_path=/m/it's",
                     "llm.draft_model_path="]
    assert args == []
    assert parse_overrides(items)["llm"] == {"model_path": "/models/a", "max_num_seqs": "8", "draft_model_path": ""}


def test_value_may_hold_equals_signs():
    items, _ = settings_from_env({SET_ENV: "llm.model_path=/a=b"})
    assert parse_overrides(items) == {"llm": {"model_path": "/a=b"}}


@pytest.mark.parametrize("bad", ["model_path=/x", "llm.model_path", "=x", ".k=v"])
def test_malformed_items_are_refused_naming_the_variable(bad):
    with pytest.raises(LauncherError, match=f"{SET_ENV}: expected MODEL.PARAMETER=VALUE items, got"):
        settings_from_env({SET_ENV: f"llm.block_size=16 {bad}"})


def test_unbalanced_quotes_are_refused_naming_the_variable():
    with pytest.raises(LauncherError, match=SET_ENV):
        settings_from_env({SET_ENV: "'llm.model_path=/x"})
    with pytest.raises(LauncherError, match=SERVER_ARGS_ENV):
        settings_from_env({SERVER_ARGS_ENV: '--log-format="ISO8601'})


def test_server_args():
    assert settings_from_env({SERVER_ARGS_ENV: "'--exit-timeout-secs=120' --log-format=ISO8601"})[1] == [
        "--exit-timeout-secs=120", "--log-format=ISO8601"]
    for owned in ("--http-port=9", "--grpc-port=9", "--metrics-port=9", "--model-repository=/x", "--model-store=/x"):
        with pytest.raises(LauncherError, match="set by the launcher"):
            settings_from_env({SERVER_ARGS_ENV: owned})


FAKE_SERVER = """#!/bin/sh
# Record the arguments and the llm config the launcher rendered, then fail as a server would.
printf '%s\\n' "$@" > "{out}/args"
for a in "$@"; do
  case "$a" in --model-repository=*) cp "${{a#--model-repository=}}/llm/config.pbtxt" "{out}/llm.pbtxt" ;; esac
done
printf '%s' "$OTEL_EXPORTER_OTLP_ENDPOINT" > "{out}/otel"
exit 3
"""


def test_main_applies_the_environment_before_set_flags(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "bin" / "tritonserver"
    fake.parent.mkdir()
    fake.write_text(FAKE_SERVER.format(out=tmp_path))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("TRITONSERVER", str(fake))
    monkeypatch.setenv(SET_ENV, "'llm.model_path=/models/from env'\nllm.max_num_seqs=8")
    monkeypatch.setenv(SERVER_ARGS_ENV, "--exit-timeout-secs=77")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    previous = signal.getsignal(signal.SIGTERM)
    try:
        code = main(["--set", "llm.max_num_seqs=16", "--log-file", str(tmp_path / "tritonserver.log")])
    finally:
        signal.signal(signal.SIGTERM, previous)  # main() installs its own handler
    assert code == 1 and "exited with code 3" in capsys.readouterr().err
    args = (tmp_path / "args").read_text().splitlines()
    assert "--exit-timeout-secs=77" in args and "--http-port=8000" in args
    config = (tmp_path / "llm.pbtxt").read_text()
    assert 'key: "model_path" value: { string_value: "/models/from env" }' in config
    assert 'key: "max_num_seqs" value: { string_value: "16" }' in config  # the --set flag wins
    assert (tmp_path / "otel").read_text() == "http://collector:4318"


def test_main_reports_a_bad_environment(monkeypatch, capsys):
    monkeypatch.setenv(SET_ENV, "nonsense")
    assert main([]) == 2
    assert SET_ENV in capsys.readouterr().err
