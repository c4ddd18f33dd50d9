"""LoRA gauges: per-adapter running / waiting, and ``lora_requests_info`` shaped as vLLM's."""
from __future__ import annotations

import time
from types import SimpleNamespace

from backend.lora.runtime import LoraStats
from backend.serving.lora_metrics import LORA_INFO_FAMILY, LORA_REQUESTS_FAMILY
from backend.serving.metrics import EngineMetrics
from tests.backend.serving.test_metrics import stats
from tests.helpers.triton_fakes import make_pb_utils


def test_lora_gauges_follow_the_engine():
    pb = make_pb_utils()
    current = [LoraStats({"a": 2}, {"c": 1}, ["a", "b"], 2)]
    lora = SimpleNamespace(stats=lambda: current[0], names=["a", "b", "c"])
    m = EngineMetrics(pb, stats, max_num_seqs=8, lora=lora)
    before = time.time()
    m.update()
    fam, = [f for f in pb.families if f.name == LORA_REQUESTS_FAMILY]
    got = {(x.labels["lora_name"], x.labels["state"]): x.value for x in fam.metrics}
    assert got == {("a", "running"): 2, ("a", "waiting"): 0, ("b", "running"): 0, ("b", "waiting"): 0,
                   ("c", "running"): 0, ("c", "waiting"): 1}
    info, = [f for f in pb.families if f.name == LORA_INFO_FAMILY]
    last = info.metrics[-1]
    assert {k: last.labels[k] for k in ("running_lora_adapters", "waiting_lora_adapters", "max_lora")} == \
        {"running_lora_adapters": "a", "waiting_lora_adapters": "c", "max_lora": "2"}
    assert last.value >= before
    current[0] = LoraStats({"a": 1, "c": 1}, {}, ["a", "c"], 2)
    m.update()
    assert info.metrics[-1].labels["running_lora_adapters"] == "a,c" and len(info.metrics) == 2
    m.close()
