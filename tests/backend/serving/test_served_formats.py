"""The formats that serve requests (weight quantization, KV cache dtype, compute dtype) on ``/metrics`` and
in every request's log line."""
from __future__ import annotations

import io
import json

from backend.engine.builder import ServedFormats
from backend.serving.metrics import MODEL_INFO_FAMILY, EngineMetrics
from backend.serving.request_log import RequestLog, log_record
from tests.backend.serving.test_llm_telemetry import record
from tests.backend.serving.test_metrics import stats
from tests.helpers.triton_fakes import make_pb_utils

FORMATS = ServedFormats(quantization="int8", kv_cache_dtype="int8", dtype="float32").labels()


def test_model_info_gauge_names_the_formats():
    pb = make_pb_utils()
    EngineMetrics(pb, stats, max_num_seqs=8, model="llm", version="1", model_info=FORMATS).update()
    fam, = [f for f in pb.families if f.name == MODEL_INFO_FAMILY]
    assert fam.kind == "gauge"
    m, = fam.metrics
    assert m.labels == {"model": "llm", "version": "1", "quantization": "int8", "kv_cache_dtype": "int8",
                        "dtype": "float32"}
    assert m.value == 1
    pb_without = make_pb_utils()
    EngineMetrics(pb_without, stats, max_num_seqs=8).update()
    assert not [f for f in pb_without.families if f.name == MODEL_INFO_FAMILY]


def test_request_log_line_names_the_formats():
    buf = io.StringIO()
    RequestLog("info", stream=buf, formats=FORMATS).write(record())
    line = json.loads(buf.getvalue())
    assert (line["quantization"], line["kv_cache_dtype"], line["dtype"]) == ("int8", "int8", "float32")
    assert "quantization" not in log_record(record())            # no formats given: no fields invented
