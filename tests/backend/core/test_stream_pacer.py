"""The adaptive stream interval: tokens per response from the measured token rate and a response budget."""
from __future__ import annotations

from backend.config import EngineConfig
from backend.core.stream_pacer import StreamPacer


def test_fixed_when_no_budget():
    p = StreamPacer(4, 0.0)
    assert p.observe(0.0, 1) == 4 and p.observe(1.0, 1000) == 4


def test_interval_follows_tokens_per_second_over_the_budget():
    p = StreamPacer(8, 100.0)
    assert p.observe(0.0, 1) == 1                      # no rate yet: every token
    t = 0.0
    for _ in range(40):                                # 50 tokens/s: under budget, every token
        t += 0.02
        p.observe(t, 1)
    assert p.interval == 1
    for _ in range(40):                                # 32 sequences x 1 token every 10 ms = 3,200 tokens/s
        t += 0.01
        p.observe(t, 32)
    assert p.interval == 8                             # capped at stream_interval
    for _ in range(40):                                # 400 tokens/s over a budget of 100: 4 per response
        t += 0.01
        p.observe(t, 4)
    assert p.interval == 4
    p.idle()
    assert p.observe(t + 5.0, 1) == 4                  # an idle gap is not a slow step


def test_config_checks_the_budget():
    import pytest
    with pytest.raises(ValueError, match="^stream_responses_per_s"):
        EngineConfig.from_settings(model_path="/m", stream_responses_per_s=-1)
    cfg = EngineConfig.from_parameters({"model_path": "/m", "stream_responses_per_s": "250"})
    assert cfg.scheduler.stream_responses_per_s == 250
