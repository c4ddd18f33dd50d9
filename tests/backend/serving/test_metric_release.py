"""The llm and postprocess models release every Triton metric object in ``finalize()``: a family left to
interpreter teardown clears its metrics through the stub's shared memory after the stub released it, and
tritonserver logs ``Segfault encountered`` in ``Metric::Clear()``. Checked with the garbage collector off:
the objects must go by reference counting while the serving object itself is still alive."""
from __future__ import annotations

import gc
import weakref

import pytest

from backend.core.scheduler_stats import SpecDecodeCounters
from backend.engine.loop_clock import LoopTime
from backend.serving.llm_serving import LLMServing
from backend.serving.llm_startup import build_telemetry
from backend.serving.metrics import EngineMetrics
from postprocess.serving import PostprocessServing
from tests.backend.serving.test_metrics import stats
from tests.backend.serving.test_llm_serving import FakeEngine
from tests.helpers.triton_fakes import MetricFamily, make_pb_utils


class Tracked:
    """pb_utils whose metric families and metrics are only weakly remembered (a family holds its metrics,
    as Triton's does)."""

    def __init__(self):
        self.pb = make_pb_utils()
        self.refs: list[weakref.ref] = []
        refs = self.refs

        class Family(MetricFamily):   # not the fake's own, which keeps every family in a list
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                refs.append(weakref.ref(self))

            def Metric(self, *a, **k):  # noqa: N802 (Triton's name)
                m = super().Metric(*a, **k)
                refs.append(weakref.ref(m))
                return m
        self.pb.MetricFamily = Family

    def alive(self) -> int:
        return sum(r() is not None for r in self.refs)


@pytest.fixture
def no_gc():
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def test_llm_serving_shutdown_releases_every_metric_and_family(no_gc):
    t = Tracked()
    counters = SpecDecodeCounters(num_drafts=2, num_draft_tokens=4, num_accepted_tokens=3, accepted_per_pos=[2, 1])
    metrics = EngineMetrics(t.pb, lambda: stats(spec=counters, loop=LoopTime(1.0, 0.5, 0.2)), max_num_seqs=4,
                            interval_s=0.01, model_info={"dtype": "float32"}).start()
    telemetry, _ = build_telemetry(t.pb, max_model_len=64, model="llm", version="1")
    serving = LLMServing(FakeEngine(), t.pb, cancel_poll_interval_s=0.01, metrics=metrics, telemetry=telemetry)
    assert t.alive() > 40                      # gauges, counters, histograms and their families
    serving.shutdown()
    assert t.alive() == 0
    assert serving.metrics is metrics          # released although their holders live on


def test_engine_metrics_publish_nothing_once_closed():
    pb = make_pb_utils()
    m = EngineMetrics(pb, lambda: stats(), max_num_seqs=4)
    m.close()
    m.update()                                 # no family to publish to, and no error


def test_postprocess_close_releases_its_metric_and_family(no_gc):
    t = Tracked()
    serving = PostprocessServing(processor=None, pb_utils=t.pb)
    assert t.alive() == 2
    serving.close()
    assert t.alive() == 0
