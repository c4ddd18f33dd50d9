"""backend/serving/request_metrics.py: vLLM-named histograms and counters, observed per finished request."""
from __future__ import annotations

import pytest

from backend.core.outputs import RequestStats
from backend.serving.request_metrics import (
    REQUEST_LATENCY_BUCKETS,
    TOKEN_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    RequestMetrics,
    build_1_2_5_buckets,
)
from tests.helpers.triton_fakes import make_pb_utils


def stats(**kw) -> RequestStats:
    base = dict(arrival_time=10.0, first_scheduled_time=10.5, first_token_time=11.0, finished_time=14.0,
                num_prompt_tokens=12, num_cached_tokens=0, num_output_tokens=4, num_decode_steps=3,
                num_prefill_chunks=1, num_preemptions=0, seed=None, inter_token_latencies=(1.0, 1.0, 1.0),
                decode_times=((3.0, 4),))
    base.update(kw)
    return RequestStats(**base)


def metric(pb, name, **labels):
    fam, = [f for f in pb.families if f.name == name]
    found = [m for m in fam.metrics if all(m.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, [m.labels for m in fam.metrics])
    return found[0]


@pytest.fixture
def pb():
    return make_pb_utils()


def test_families_kinds_labels_and_buckets(pb):
    RequestMetrics(pb, max_model_len=1024, model="llm", version="3")
    kinds = {f.name: f.kind for f in pb.families}
    assert kinds == {
        "triton_llm_time_to_first_token_seconds": "histogram",
        "triton_llm_time_per_output_token_seconds": "histogram",
        "triton_llm_e2e_request_latency_seconds": "histogram",
        "triton_llm_request_queue_time_seconds": "histogram",
        "triton_llm_request_prompt_tokens": "histogram",
        "triton_llm_request_generation_tokens": "histogram",
        "triton_llm_prompt_tokens_total": "counter",
        "triton_llm_generation_tokens_total": "counter",
        "triton_llm_request_success_total": "counter",
    }
    assert metric(pb, "triton_llm_time_to_first_token_seconds").buckets == TTFT_BUCKETS
    assert metric(pb, "triton_llm_e2e_request_latency_seconds").buckets == REQUEST_LATENCY_BUCKETS
    assert metric(pb, "triton_llm_time_per_output_token_seconds").buckets == TOKEN_LATENCY_BUCKETS
    assert metric(pb, "triton_llm_request_prompt_tokens").buckets == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    assert metric(pb, "triton_llm_prompt_tokens_total").labels == {"model": "llm", "version": "3"}
    reasons = {m.labels["finish_reason"] for f in pb.families if f.name == "triton_llm_request_success_total"
               for m in f.metrics}
    assert reasons == {"stop", "length", "abort", "error"}


def test_build_1_2_5_buckets():
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert build_1_2_5_buckets(1) == [1]
    assert build_1_2_5_buckets(4) == [1, 2]


def test_record_observes_each_histogram_once_and_counts_tokens(pb):
    m = RequestMetrics(pb, max_model_len=256)
    m.record(stats(), "length")
    m.record(stats(num_prompt_tokens=3, num_output_tokens=2, inter_token_latencies=(0.5,), decode_times=((0.5, 2),)),
             "stop")
    assert metric(pb, "triton_llm_time_to_first_token_seconds").observations == [1.0, 1.0]
    assert metric(pb, "triton_llm_request_queue_time_seconds").observations == [0.5, 0.5]
    assert metric(pb, "triton_llm_e2e_request_latency_seconds").observations == [4.0, 4.0]
    assert metric(pb, "triton_llm_time_per_output_token_seconds").observations == [1.0, 0.5]
    assert metric(pb, "triton_llm_request_prompt_tokens").observations == [12, 3]
    assert metric(pb, "triton_llm_request_generation_tokens").observations == [4, 2]
    assert metric(pb, "triton_llm_prompt_tokens_total").value == 15
    assert metric(pb, "triton_llm_generation_tokens_total").value == 6
    assert metric(pb, "triton_llm_request_success_total", finish_reason="length").value == 1
    assert metric(pb, "triton_llm_request_success_total", finish_reason="stop").value == 1
    assert metric(pb, "triton_llm_request_success_total", finish_reason="abort").value is None


def test_partial_requests_skip_what_they_never_reached(pb):
    m = RequestMetrics(pb, max_model_len=256)
    # aborted while waiting: no scheduling, no token
    m.record(stats(first_scheduled_time=None, first_token_time=None, num_output_tokens=0, inter_token_latencies=(),
                   decode_times=()), "abort")
    # one token only: no time per output token
    m.record(stats(num_output_tokens=1, inter_token_latencies=(), decode_times=((0.0, 1),)), "length")
    # never reached the engine
    m.record(None, "error")
    # an unknown reason counts as an error rather than vanishing
    m.record(None, "weird")
    assert metric(pb, "triton_llm_request_queue_time_seconds").count == 1
    assert metric(pb, "triton_llm_time_to_first_token_seconds").count == 1
    assert metric(pb, "triton_llm_time_per_output_token_seconds").count == 0
    assert metric(pb, "triton_llm_e2e_request_latency_seconds").count == 2
    assert metric(pb, "triton_llm_request_success_total", finish_reason="error").value == 2
    assert metric(pb, "triton_llm_generation_tokens_total").value == 1
