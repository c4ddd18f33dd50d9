"""Client cancellation and the `stop` request free the sequence in the engine at once."""
from __future__ import annotations

import time

from tests.e2e.helpers import Stream, engine_idle, kv_used, run, wait_until
from cli.client import build_inputs

LONG = 600  # tokens the request would generate if nothing stopped it (min_tokens keeps EOS away)


def long_request(**opts):
    return build_inputs("def parse(lines):\n", LONG, min_tokens=LONG, temperature=0.0, stream=True,
                        exclude_input_in_output=True, **opts)


def test_client_cancellation_frees_kv(server):
    url = server.grpc_url
    base = engine_idle(server.metrics_url, "the previous tests")
    s = Stream(url)
    rid = s.send(long_request())
    got = 0
    while got < 3:
        r, chunk = s.pump(timeout=60)
        assert chunk is not None, s.results[r].error
        got += 1
    wait_until(lambda: kv_used(server.metrics_url) > 0, 5, "the running request holds KV blocks")
    s.close(cancel=True)  # cancels every request in flight on this gRPC stream
    used_steps = engine_idle(server.metrics_url, "client cancellation") - base
    assert used_steps < LONG // 2, f"the engine ran {used_steps} steps for a request cancelled after 3 tokens"
    assert not s.results[rid].num_final  # the client went away before the end
    ok = run(url, "x = 1", 4, temperature=0.0)
    assert ok.error is None and ok.num_final == 1


def test_stop_request_ends_the_stream_with_a_final_response(server):
    url = server.grpc_url
    base = engine_idle(server.metrics_url, "the previous tests")
    with Stream(url) as s, Stream(url) as stopper:
        rid = s.send(long_request(), request_id="stop-me-1")
        for _ in range(3):
            _, chunk = s.pump(timeout=60)
            assert chunk is not None
        t0 = time.monotonic()
        stop_id = stopper.send(build_inputs("", 1, stop=True), request_id="stop-me-1")
        ack = stopper.wait([stop_id], timeout=10)[stop_id]
        assert ack.error is None and ack.num_final == 1 and ack.text == ""
        res = s.wait([rid], timeout=30)[rid]
        elapsed = time.monotonic() - t0
    assert res.error is None, res.error
    assert res.num_final == 1 and res.chunks[-1].final
    assert res.finish_reason == "abort"
    assert res.num_output_tokens < LONG
    assert elapsed < 10
    used_steps = engine_idle(server.metrics_url, "the stop request") - base
    assert used_steps < LONG // 2, f"the engine ran {used_steps} steps for a request stopped after 3 tokens"


def test_stop_request_for_an_unknown_id_is_answered(server):
    with Stream(server.grpc_url) as s:
        rid = s.send(build_inputs("", 1, stop=True), request_id="nobody-has-this-id")
        res = s.wait([rid], timeout=10)[rid]
    assert res.error is None and res.num_final == 1


def test_direct_llm_request_cancellation(server):
    """A client of the `llm` model itself: its cancellation reaches the engine through is_cancelled()."""
    import numpy as np

    from contracts import wire
    from contracts.sampling_params import SamplingParams
    from tests.e2e.helpers import raw_input

    base = engine_idle(server.metrics_url, "the previous tests")
    req = wire.LLMRequest(SamplingParams(max_tokens=LONG, min_tokens=LONG, temperature=0.0), stream=True)
    inputs = [raw_input(wire.INPUT_IDS, np.asarray([[0, 5, 6, 7, 8]], dtype=np.int32), "INT32"),
              raw_input(wire.REQUEST, np.asarray([[req.to_json().encode()]], dtype=np.object_), "BYTES")]
    s = Stream(server.grpc_url)
    s.client.async_stream_infer("llm", inputs, request_id="direct-1", enable_empty_final_response=True)
    for _ in range(3):
        assert s._q.get(timeout=60)[1] is None
    s.close(cancel=True)
    used_steps = engine_idle(server.metrics_url, "cancelling a direct llm request") - base
    assert used_steps < LONG // 2, f"the engine ran {used_steps} steps for a request cancelled after 3 tokens"
