"""The README tour's metrics command shows what its comment promises: read from the README, its ``grep -E``
pattern, applied to the live server's ``/metrics`` after a request, picks the KV-block, request and latency lines
(and fits the screen)."""
from __future__ import annotations

import re
import urllib.request

from tests.e2e.helpers import run
from tests.helpers.api_docs import REPO


def tour_metrics_pattern() -> tuple[str, str]:
    """(the grep -E pattern, the command's comment) of the tour's ``curl .../metrics | grep -E '...'`` line."""
    text = (REPO / "README.md").read_text()
    tour = text[text.index("## A five-minute tour"):text.index("## Layout")]
    m = re.search(r"^curl -s localhost:8002/metrics \| grep -E '([^']+)'\s*#\s*(.+)$", tour, re.M)
    assert m, "README's tour has no `curl -s localhost:8002/metrics | grep -E '...'  # ...` line"
    return m.group(1), m.group(2)


def test_the_tour_metrics_grep_shows_kv_blocks_requests_and_latency(server):
    pattern, comment = tour_metrics_pattern()
    assert comment.strip() == "KV blocks, requests, latency"
    assert run(server.grpc_url, "import os", 8).error is None
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        lines = r.read().decode().splitlines()
    shown = [line for line in lines if re.search(pattern, line)]     # this ERE is also a Python regex
    names = {line.split("{", 1)[0].split(" ", 1)[0] for line in shown}
    assert {"nv_trt_llm_kv_cache_block_metrics", "nv_trt_llm_request_metrics"} <= names, names
    assert any(n.endswith("_latency_seconds_sum") for n in names) and any(n.endswith("_count") for n in names), names
    assert all(n.startswith(("nv_trt_llm_", "triton_llm_")) for n in names), names
    assert len(shown) <= 24, f"{len(shown)} lines: more than a screen"
