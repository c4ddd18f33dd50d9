"""Speculative decoding through the ensemble (the e2e server runs the shipped n-gram speculation: k <= 8, adaptive)."""
from __future__ import annotations

from tests.e2e.helpers import metrics, run, wait_until

REPEATING = "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2, 3]\nw = [1, 2,"


def spec_total(url: str, name: str) -> float:
    return sum(v for (n, _), v in metrics(url).items() if n == f"triton_llm_spec_decode_{name}")


def test_perf_metrics_report_drafts_and_acceptance(server):
    before = spec_total(server.metrics_url, "num_draft_tokens_total")
    res = run(server.grpc_url, REPEATING, 48, temperature=0.0, exclude_input_in_output=True, stream=True,
              return_perf_metrics=True)
    assert res.error is None, res.error
    last = res.chunks[-1] if res.chunks[-1].total_draft_tokens else max(res.chunks, key=lambda c: c.total_draft_tokens)
    assert last.total_draft_tokens > 0, "a repeating prompt should make the n-gram proposer draft"
    assert 0 < last.total_accepted_draft_tokens <= last.total_draft_tokens
    assert abs(last.acceptance_rate - last.total_accepted_draft_tokens / last.total_draft_tokens) < 1e-6
    off = run(server.grpc_url, REPEATING, 48, temperature=0.0, exclude_input_in_output=True)
    assert off.error is None and all(c.total_draft_tokens == 0 for c in off.chunks)   # not asked: zeros
    assert off.text == res.text
    wait_until(lambda: spec_total(server.metrics_url, "num_draft_tokens_total") >= before + last.total_draft_tokens,
               10, "the draft-token counter to grow by the request's drafts")
    per_pos = {dict(k).get("position"): v for (n, k), v in metrics(server.metrics_url).items()
               if n == "triton_llm_spec_decode_num_accepted_tokens_per_pos_total"}
    assert per_pos.get("0", 0) > 0


def test_a_request_can_turn_speculation_off_or_is_refused_above_the_engine(server):
    res = run(server.grpc_url, REPEATING, 32, temperature=0.0, exclude_input_in_output=True,
              return_perf_metrics=True, num_speculative_tokens=0)
    assert res.error is None and max(c.total_draft_tokens for c in res.chunks) == 0
    spec = run(server.grpc_url, REPEATING, 32, temperature=0.0, exclude_input_in_output=True)
    assert res.text == spec.text
    bad = run(server.grpc_url, REPEATING, 8, num_speculative_tokens=9)
    assert bad.error is not None and "num_speculative_tokens" in bad.error
    neg = run(server.grpc_url, REPEATING, 8, num_speculative_tokens=-1)
    assert neg.error is not None and "num_speculative_tokens" in neg.error
