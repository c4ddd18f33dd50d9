"""docs/grafana/triton-llm-dashboard.json queries only series the llm model publishes."""
from __future__ import annotations

import json
import re
from pathlib import Path

from backend.serving.metrics import GENERAL_GAUGES, KV_GAUGES, REQUEST_GAUGES, EngineMetrics
from backend.serving.request_metrics import RequestMetrics
from tests.helpers.triton_fakes import make_pb_utils

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "triton-llm-dashboard.json"


def published() -> dict[str, str]:
    """family name -> kind, as the llm model creates them."""
    pb = make_pb_utils()
    RequestMetrics(pb, max_model_len=1024)
    EngineMetrics(pb, lambda: None, max_num_seqs=8)
    return {f.name: f.kind for f in pb.families}


def exprs(dash) -> list[str]:
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_every_query_names_a_published_series_with_known_labels():
    dash = json.loads(DASHBOARD.read_text())
    families = published()
    labels = {"kv_cache_block_type": set(KV_GAUGES) | {"max"}, "request_type": set(REQUEST_GAUGES) | {"max"},
              "general_type": set(GENERAL_GAUGES)}
    queries = exprs(dash)
    assert len(queries) >= 15
    used = set()
    for q in queries:
        for name in re.findall(r"\b((?:triton_llm|nv_trt_llm)_\w+)", q):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if base != name:
                assert families.get(base) == "histogram", f"{name}: {base} is not a published histogram"
            else:
                assert name in families, f"{name} is not published"
                assert families[name] != "histogram", f"{name}: a histogram is queried as _bucket/_sum/_count"
            used.add(base)
        for key, value in re.findall(r'(kv_cache_block_type|request_type|general_type)="(\w+)"', q):
            assert value in labels[key], f'{key}="{value}" is never set'
        if "histogram_quantile" in q:
            assert "_bucket" in q and "by (le)" in q, q
    # every latency histogram has a panel
    assert {n for n, k in families.items() if k == "histogram"} <= used


def test_layout_and_template():
    dash = json.loads(DASHBOARD.read_text())
    cells = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panel {p['title']!r} overlaps another"
                cells.add((x, y))
        assert g["x"] + g["w"] <= 24
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource", "model"]
    assert all('model="$model"' in q for q in exprs(dash))
