"""A real Prometheus scrapes the session server every second: every PromQL query in docs/observability.md and
in the Grafana dashboard answers through its HTTP API with the expected series, the counts it reads equal the
requests sent, and ``promtool check metrics`` accepts every ``triton_llm_*`` / ``nv_trt_llm_*`` family.

The queries are read from the documents, not copied here, so a broken documented query fails this test.
Needs the ``prometheus`` and ``promtool`` binaries on PATH (Debian: ``apt-get install prometheus``; ``.ci/run``
installs it); without them the tests skip, saying so.
"""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from cli.client import build_inputs
from cli.launcher import free_port
from tests.e2e.helpers import Stream, engine_idle, metrics, wait_until
from tests.e2e.test_request_telemetry import log_lines

REPO = Path(__file__).resolve().parents[2]
OBSERVABILITY = REPO / "docs" / "observability.md"
DASHBOARD = REPO / "docs" / "grafana" / "triton-llm-dashboard.json"
OURS = re.compile(r"\b((?:triton_llm|nv_trt_llm)_\w+)")
DASHBOARD_VARS = {"$model": "llm", "$__rate_interval": "1m"}
# prompts: repetitive text (n-gram drafts: the acceptance rate is defined), the same prompt twice
# (prefix cache hits), at least 2 tokens each (time per output token)
PROMPTS = ["x = 1\nx = 1\nx = 1\nx = 1\n", "def add(a, b):", "def add(a, b):", "for i in range(10):\n    ",
           "a b a b a b a b a b", "import json\n\n"]

pytestmark = pytest.mark.skipif(
    not (shutil.which("prometheus") and shutil.which("promtool")),
    reason="no prometheus/promtool binary on PATH (Debian: apt-get install prometheus; README.md, 'Two commands')")


def documented_queries(markdown: str) -> list[str]:
    """The PromQL of a markdown text: each query of its ```promql blocks (a query's continuation lines are
    indented; ``#`` lines are comments), and each inline code span that calls a function on one of our series."""
    queries = []
    for block in re.findall(r"```promql\n(.*?)```", markdown, flags=re.S):
        for line in block.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if line[0].isspace() and queries:
                queries[-1] += " " + line.strip()
            else:
                queries.append(line.strip())
    prose = re.sub(r"```.*?```", "", markdown, flags=re.S)
    for span in re.findall(r"`([^`]+)`", prose):
        span = " ".join(span.split())
        if re.match(r"^[a-z_]+\(", span) and OURS.search(span):
            queries.append(span)
    return queries


def dashboard_queries(dash: dict) -> list[str]:
    """Every panel target's expression and the template variables' ``label_values(series, label)`` series,
    with the dashboard's variables set as Grafana would set them for the llm model."""
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query["query"])
            assert m, f"template variable {var['name']}: unexpected query {query['query']!r}"
            exprs.append(f'{m.group(1)}{{{m.group(2)}!=""}}')
    for name, value in DASHBOARD_VARS.items():
        exprs = [e.replace(name, value) for e in exprs]
    assert not [e for e in exprs if "$" in e], "a dashboard variable this test does not set"
    return exprs


def expected_series(query: str, scraped: dict) -> int:
    """One series per query, except under an outer ``sum by (label)``: one per value of that label on the
    series the query names (as scraped from the server itself)."""
    m = re.match(r"^sum by \((\w+)\)", query)
    if not m:
        return 1
    names = set(OURS.findall(query))
    return len({dict(labels).get(m.group(1)) for name, labels in scraped if name in names})


class Prometheus:
    """``prometheus`` in a temporary directory, scraping one target every second."""

    def __init__(self, root: Path, target: str):
        self.port = free_port()
        config = root / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                          "scrape_configs:\n  - job_name: triton\n    static_configs:\n"
                          f"      - targets: ['{target}']\n")
        self.log = root / "prometheus.log"
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={root / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        wait_until(self._ready, 60, f"prometheus ready on :{self.port} (log: {self.log})", interval=0.2)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2).status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[tuple[dict, float]]:
        """An instant query: [(labels, value)]; fails on an error answer (a query that does not parse)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            body = json.loads(urllib.request.urlopen(url, timeout=10).read())
        except urllib.error.HTTPError as e:
            raise AssertionError(f"prometheus refused {expr!r}: {e.read().decode()[:500]}") from None
        assert body["status"] == "success", (expr, body)
        data = body["data"]
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def value(self, expr: str) -> float:
        (_, v), = self.query(expr)
        return v

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def prometheus(server, tmp_path_factory):
    target = urllib.parse.urlparse(server.metrics_url).netloc
    prom = Prometheus(tmp_path_factory.mktemp("prometheus"), target)
    try:
        wait_until(lambda: prom.query('up{job="triton"} == 1'), 30, "prometheus scraping the server", interval=0.2)
        yield prom
    finally:
        prom.stop()


def total(prom: Prometheus, name: str, **labels: str) -> float:
    sel = ",".join(f'{k}="{v}"' for k, v in {"model": "llm", **labels}.items())
    return sum(v for _, v in prom.query(f"{name}{{{sel}}}"))


def send_traffic(server) -> tuple[int, int, int, int]:
    """The prompts, one after the other (so that each engine decode step is one request's):
    (requests, output tokens, prompt tokens, decode steps as the request log counts them)."""
    results, decode_steps = [], 0
    with Stream(server.grpc_url) as s:
        for p in PROMPTS:
            rid = s.send(build_inputs(p, 12, temperature=0.0, min_tokens=2, stream=True,
                                      exclude_input_in_output=True))
            results.append(s.wait([rid], 120)[rid])
            line, = log_lines(server, rid)
            decode_steps += line["decode_steps"]
    assert all(r.error is None and r.num_final == 1 for r in results), [r.error for r in results]
    return (len(results), sum(r.num_output_tokens for r in results),
            sum(r.chunks[0].num_input_tokens for r in results), decode_steps)


def test_queries_are_found_in_the_docs_and_the_dashboard():
    docs = documented_queries(OBSERVABILITY.read_text())
    dash = dashboard_queries(json.loads(DASHBOARD.read_text()))
    assert len(docs) >= 10 and len(dash) >= 20
    assert any("histogram_quantile" in q and "inter_token_latency" in q for q in docs)
    assert all(OURS.search(q) for q in docs + dash)


def test_every_documented_query_answers_through_a_real_prometheus(server, prometheus):
    engine_idle(server.metrics_url, "the requests before this test")
    n_before = total(prometheus, "triton_llm_e2e_request_latency_seconds_count")   # after one scrape at least
    before = {name: total(prometheus, name) for name in (
        "triton_llm_time_to_first_token_seconds_count", "triton_llm_inter_token_latency_seconds_count",
        "triton_llm_request_success_total", "triton_llm_generation_tokens_total", "triton_llm_prompt_tokens_total")}
    n, out_tokens, in_tokens, decode_steps = send_traffic(server)
    engine_idle(server.metrics_url, "the traffic")
    # the telemetry thread has recorded them, and prometheus has scraped the result
    wait_until(lambda: total(prometheus, "triton_llm_e2e_request_latency_seconds_count") == n_before + n and
               total(prometheus, "triton_llm_inter_token_latency_seconds_count") ==
               before["triton_llm_inter_token_latency_seconds_count"] + decode_steps, 30,
               "prometheus seeing every request's histograms and every decode step's gap", interval=0.2)
    time.sleep(2.5)                      # two more scrapes: nothing else arrives (exact counts, settled gauges)
    direct = metrics(server.metrics_url)

    # the counts prometheus reads are the requests sent
    def grew(name, **labels):
        return total(prometheus, name, **labels) - before[name]
    assert grew("triton_llm_time_to_first_token_seconds_count") == n
    assert grew("triton_llm_inter_token_latency_seconds_count") == decode_steps     # one per decode step
    assert n <= decode_steps <= out_tokens - n
    assert grew("triton_llm_request_success_total") == n
    assert grew("triton_llm_generation_tokens_total") == out_tokens
    assert grew("triton_llm_prompt_tokens_total") == in_tokens
    assert total(prometheus, "triton_llm_inter_token_latency_seconds_bucket", le="+Inf") == \
        total(prometheus, "triton_llm_inter_token_latency_seconds_count")
    # the router's gauges as prometheus stored them are the server's (an idle engine: no KV in use)
    for label, kind in (("kv_cache_block_type", "fraction"), ("kv_cache_block_type", "tokens_per"),
                        ("kv_cache_block_type", "max"), ("request_type", "waiting"), ("request_type", "scheduled")):
        name = "nv_trt_llm_kv_cache_block_metrics" if label.startswith("kv") else "nv_trt_llm_request_metrics"
        stored = total(prometheus, name, **{label: kind})
        scraped = [v for (m, ls), v in direct.items() if m == name and (label, kind) in ls]
        assert scraped == [stored], (kind, scraped, stored)
    assert total(prometheus, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="fraction") == 0.0

    queries = documented_queries(OBSERVABILITY.read_text()) + dashboard_queries(json.loads(DASHBOARD.read_text()))
    for q in queries:
        answer, want = prometheus.query(q), expected_series(q, direct)
        assert len(answer) == want, f"{q}: {len(answer)} series, expected {want}: {answer}"
        assert all(math.isfinite(v) for _, v in answer), f"{q}: {answer}"


def our_families(text: str) -> str:
    """The exposition text of the triton_llm_* and nv_trt_llm_* families only (Triton's own nv_inference_*,
    nv_gpu_* ... keep the names Triton gives them; they are not ours to rename)."""
    keep = []
    for line in text.splitlines():
        name = line.split()[2] if line.startswith("# ") and len(line.split()) > 2 else re.split(r"[{ ]", line)[0]
        if OURS.match(name):
            keep.append(line)
    return "\n".join(keep) + "\n"


def promtool_findings(text: str) -> str:
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    return (done.stdout + done.stderr).strip() if done.returncode or done.stdout.strip() else ""


def test_promtool_check_metrics_accepts_our_families(server):
    text = our_families(urllib.request.urlopen(server.metrics_url, timeout=10).read().decode())
    for family in ("triton_llm_inter_token_latency_seconds", "triton_llm_time_to_first_token_seconds",
                   "nv_trt_llm_kv_cache_block_metrics", "triton_llm_spec_decode_num_drafts_total"):
        assert f"# TYPE {family} " in text, family
    assert "# TYPE triton_llm_inter_token_latency_seconds histogram" in text
    assert promtool_findings(text) == ""
    # the linter does flag a histogram's series exported as counters
    bad = "# HELP x_seconds_bucket b\n# TYPE x_seconds_bucket counter\nx_seconds_bucket{le=\"+Inf\"} 1\n"
    assert "x_seconds_bucket" in promtool_findings(bad)
