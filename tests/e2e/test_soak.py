"""tools/soak.py against the real server, briefly, half through a gateway: nothing hung or lost, the server idle
afterwards, RSS, fds and threads sampled for every process."""
from tools import soak


def test_short_soak_loses_nothing(server, tmp_path):
    out = tmp_path / "soak.json"
    code = soak.main(["--url", server.grpc_url, "--metrics-url", server.metrics_url, "--requests", "80",
                      "--concurrency", "16", "--warmup", "20", "--rss-every", "40", "--gateway", "--out", str(out)])
    import json
    report = json.loads(out.read_text())
    c = report["counts"]
    assert code == 0, report["unexpected"]
    assert c["sent"] == 80 and c["hung"] == 0 and c["lost"] == 0 and c["unexpected_error"] == 0
    assert c["completed"] > 0 and c["cancelled"] > 0 and c["clean_error"] > 0
    assert report["idle"]["kv_blocks_used"] == 0 and report["idle"]["active_requests"] == 0
    assert [s["at"] for s in report["rss_mib"]][:2] == ["start", "after warm-up"]
    assert report["rss_mib"][0]["tritonserver"] > 0 and report["rss_mib"][0]["stub:llm"] > 0
    assert report["rss_mib"][0]["gateway"] > 0 and report["fds"][0]["gateway"] > 0
    assert report["threads"][-1]["stub:llm"] >= 1
    assert set(report["growth"]) == {"rss_pct", "fds", "threads"} and "gateway" in report["growth"]["rss_pct"]
    through_gateway = {k: v for k, v in report["by_kind"].items() if k.endswith("(gateway)")}
    assert sum(v.get("completed", 0) for v in through_gateway.values()) > 0, report["by_kind"]
