"""The session server says which formats serve requests: the ``triton_llm_model_info`` gauge and each
request's log line carry the weight quantization, the KV cache dtype and the compute dtype."""
from __future__ import annotations

from tests.e2e.helpers import Stream, gauge
from tests.e2e.test_request_telemetry import log_lines
from cli.client import build_inputs


def test_model_info_gauge_and_log_line_name_the_formats(server):
    served = {"quantization": "none", "kv_cache_dtype": "auto", "dtype": "float32"}   # the session server's config
    assert gauge(server.metrics_url, "triton_llm_model_info", model="llm", **served) == 1
    with Stream(server.grpc_url) as s:
        rid = s.send(build_inputs("def f(x):", 4, temperature=0.0), request_id="formats-1")
        assert s.wait([rid], 60)[rid].error is None
    line, = log_lines(server, "formats-1")
    assert {k: line[k] for k in served} == served
