"""schemathesis against the HTTP API's own /openapi.json (a fake Triton behind it): whatever the fuzzer sends,
no 500, no hang, and only the statuses and content types the document declares. The served model's name
goes in ``model``, so that bodies reach the upstream. Each operation's cases come from schemathesis'
hypothesis strategy, run by hypothesis."""
from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import content_type_conformance, not_a_server_error, status_code_conformance

from tests.gateway.openai_harness import MODEL, served

REQUEST_TIMEOUT_S = 10      # a hang fails the case
EXAMPLES = 40


@pytest.fixture(scope="module")
def base_url():
    with served() as s:
        yield s.base_url


def operations(base_url: str) -> list:
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def test_every_route_is_fuzzed(base_url):
    paths = {op.path for op in operations(base_url)}
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/health/ready", "/metrics"} <= paths


def test_no_server_error_and_no_hang(base_url):
    for op in operations(base_url):
        if op.path == "/metrics":     # a proxy of Triton's port, which the fake does not serve (503 by design)
            continue

        @given(case=op.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case):
            if isinstance(case.body, dict) and "model" in case.body:
                case.body["model"] = MODEL        # else nearly every case stops at 404 model_not_found
            response = case.call(base_url=base_url, timeout=REQUEST_TIMEOUT_S)
            case.validate_response(response, checks=[not_a_server_error, status_code_conformance,
                                                     content_type_conformance])
        run()
