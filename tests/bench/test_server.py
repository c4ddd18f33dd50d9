"""bench/harness/server.py: the in-process engine gets the llm model's config.pbtxt with the same overrides."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness import server


def test_engine_config_follows_llm_config_pbtxt_and_overrides(tmp_path):
    overrides = server.repository_overrides(tmp_path, ["llm.max_num_seqs=8", "llm.kv_cache_bytes=4MiB"])
    assert overrides["preprocess"] == {"tokenizer_path": str(tmp_path)}
    assert overrides["postprocess"] == {"tokenizer_path": str(tmp_path)}
    cfg, params = server.engine_config(overrides)
    assert cfg.model.model_path == str(tmp_path) and cfg.scheduler.max_num_seqs == 8
    assert cfg.cache.kv_cache_bytes == 4 << 20
    text = (server.MODEL_REPOSITORY / "llm" / "config.pbtxt").read_text()
    file_params = server.pbtxt_parameters(text)
    assert params["block_size"] == file_params["block_size"]
    assert "cancel_poll_interval_s" in file_params and "cancel_poll_interval_s" not in params  # serving-only
    default_cfg, _ = server.engine_config({})
    assert Path(default_cfg.model.model_path).is_absolute()  # relative paths resolve against the repository


def test_run_with_server_against_a_url_starts_nothing_and_reports_stops(tmp_path, capsys):
    assert server.run_with_server(lambda url, srv: (url, srv), {}, url="h:1", out=tmp_path, name="x",
                                  server_timeout=1) == ("h:1", None)

    def dies(url, srv):
        server.check_alive(srv, "concurrency 4")  # not ours: never raises
        raise server.ServerDied("tritonserver exited with code 1 during concurrency 4")

    assert server.run_with_server(dies, {}, url="h:1", out=tmp_path, name="x", server_timeout=1) is None
    assert "stopped: ServerDied: tritonserver exited with code 1 during concurrency 4" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # no server of ours, no log
    with pytest.raises(ValueError):  # anything else is a bug: raised, not swallowed
        server.run_with_server(lambda url, srv: int("x"), {}, url="h:1", out=tmp_path, name="x", server_timeout=1)
