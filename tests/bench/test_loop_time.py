"""bench/harness/loop_time.py: the llm model's loop seconds read back from a Prometheus exposition."""
from __future__ import annotations

from backend.engine.loop_clock import LoopTime
from backend.serving.metrics import EngineMetrics
from bench.harness.loop_time import describe, parse_loop_seconds
from tests.backend.serving.test_metrics import stats
from tests.helpers.triton_fakes import make_pb_utils


def exposition(pb) -> str:
    """The fake families as tritonserver's /metrics would print them (labels sorted, as it does)."""
    lines = []
    for fam in pb.families:
        for m in fam.metrics:
            if m.value is not None:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(m.labels.items()))
                lines.append(f"{fam.name}{{{labels}}} {m.value}")
    return "\n".join(lines)


def test_published_loop_seconds_read_back():
    pb = make_pb_utils()
    EngineMetrics(pb, lambda: stats(loop=LoopTime(busy_s=4.0, cpu_s=3.0, runqueue_s=0.5)), max_num_seqs=8,
                  model="llm").update()
    text = exposition(pb)
    assert parse_loop_seconds(text) == LoopTime(4.0, 3.0, 0.5)
    assert parse_loop_seconds(text, model="other") is None
    assert describe(parse_loop_seconds(text)) == "busy 4.00 s: cpu 75.0%, run queue 12.5%, blocked 12.5%"


def test_nothing_published_yet():
    pb = make_pb_utils()
    EngineMetrics(pb, lambda: stats(), max_num_seqs=8).update()
    assert parse_loop_seconds(exposition(pb)) is None
    assert describe(None) == "not measured"
