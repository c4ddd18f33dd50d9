"""tools/soak.py without a server: the mix (each bad input is rejected by the real parser with an error
naming the field it claims; each good one parses), the outcome summary and table, finding processes."""
from __future__ import annotations

import os

import pytest

from tools import server_watch, soak, soak_mix
from preprocess.errors import RequestError
from preprocess.request import RequestParser
from preprocess.tokenizer import load_tokenizer
from tests.helpers.checkpoints import DEMO_TARGET
from cli.client import to_array


@pytest.fixture(scope="module")
def plans():
    return soak_mix.make_plans(400, seed=3, cancel_share=0.2, bad_share=0.1, sampled_share=0.5, max_tokens=(8, 64))


def test_mix_is_seeded_and_shared_as_asked(plans):
    again = soak_mix.make_plans(400, seed=3, cancel_share=0.2, bad_share=0.1, sampled_share=0.5, max_tokens=(8, 64))
    assert [p.values for p in plans] == [p.values for p in again]
    kinds = {k: sum(p.kind == k for p in plans) for k in ("greedy", "sampled", "cancel", "bad")}
    assert 20 <= kinds["bad"] <= 65 and 50 <= kinds["cancel"] <= 110 and kinds["greedy"] > 50 and kinds["sampled"] > 50
    lengths = sorted(len(p.values.get("text_input") or "") for p in plans if p.kind != "bad")
    assert lengths[0] < 100 and lengths[-1] > 800                     # varied prompt lengths


def test_bad_inputs_fail_where_the_soak_expects_and_good_ones_parse(plans):
    parser = RequestParser(load_tokenizer(DEMO_TARGET))
    engine_checked = 0
    for p in plans:
        inputs = {k: to_array(k, v) for k, v in p.values.items()}
        if p.kind != "bad":
            pre = parser.parse(inputs)
            assert len(pre.prompt_token_ids) + pre.sampling_params.max_tokens <= 1024
            continue
        try:
            parser.parse(inputs)
        except RequestError as e:
            assert e.field == p.error_field, (p.values, str(e))
        else:   # accepted by preprocess: the engine's context check rejects it (max_tokens beyond the context)
            assert p.error_field == "max_tokens" and p.values["max_tokens"] > 1024
            engine_checked += 1
    assert engine_checked > 0


def test_summary_and_table():
    outs = [soak.Outcome(0, "greedy", "completed", 1.0), soak.Outcome(1, "bad", "clean_error", 0.1),
            soak.Outcome(2, "cancel", "cancelled", 0.3), soak.Outcome(3, "greedy", "hung", 120, detail="no final")]
    report = soak.Report(config={}, seconds=2.0, requests_per_s=2.0, idle={"kv_blocks_used": 0, "active_requests": 0},
                         rss_mib=[{"at": "start", "requests": 0, "tritonserver": 40.0, "stub:llm": None}])
    soak.summarize(outs, report)
    assert report.counts == {"completed": 1, "cancelled": 1, "clean_error": 1, "unexpected_error": 0, "hung": 1,
                             "lost": 0, "sent": 4}
    assert report.by_kind["greedy"] == {"completed": 1, "hung": 1}
    text = soak.table(report)
    assert "hung 1  lost 0" in text and "40.0" in text and report.unexpected == ["#3 greedy: hung: no final"]


def test_process_lookup():
    assert server_watch.find_server_pid(1) is None
    procs = server_watch.server_processes(os.getpid())
    assert procs == {"tritonserver": os.getpid()}
    assert server_watch.rss_sample(procs, "x", 0)["tritonserver"] > 0


def test_fds_threads_and_second_half_growth():
    procs = {"tritonserver": os.getpid()}
    assert server_watch.count_sample(procs, "x", 0, "fds")["tritonserver"] > 0
    assert server_watch.count_sample(procs, "x", 0, "threads")["tritonserver"] >= 1
    samples = [{"at": "start", "requests": 0, "a": 10.0, "b": 5.0}, {"at": "after 40", "requests": 40, "a": 100.0,
                                                                      "b": 5.0},
               {"at": "after 50", "requests": 50, "a": 110.0, "b": None}, {"at": "end", "requests": 100, "a": 104.0,
                                                                           "b": 6.0}]
    assert server_watch.second_half_growth(samples, percent=True) == {"a": -5.45, "b": None}
    samples[2]["b"] = 4.0
    assert server_watch.second_half_growth(samples, percent=False) == {"a": -6.0, "b": 2.0}
    assert server_watch.second_half_growth(samples[:1], percent=True) == {}


def test_gateway_requests_say_what_the_plans_say(plans):
    from tools import soak_gateway

    expressed = 0
    for p in plans:
        req = soak_gateway.generate_request(p)
        if p.values.get("messages") == "[{oops":
            assert req is None
            continue
        expressed += 1
        assert req.max_tokens == p.values["max_tokens"]
        if "text_input" in p.values:
            assert req.prompt == p.values["text_input"] and req.stream
        if p.kind == "bad" and p.error_field != "messages":
            assert soak_gateway.FIELD_OF_INPUT.get(p.error_field, p.error_field) in req.DESCRIPTOR.fields_by_name
    assert expressed > len(plans) // 2
