"""bench/harness/workload.py: seeded requests; the pipeline's are parsed by preprocess exactly as the server does."""
from __future__ import annotations

from bench import bench_pipeline as bp
from bench.harness.workload import make_workload, requests_for, sample_spans
from tests.helpers.checkpoints import DEMO_TARGET


def test_requests_per_level_are_bounded():
    assert [requests_for(c, 8, 48) for c in bp.LEVELS] == [8, 8, 16, 32, 48]


def test_spans_are_seeded_and_within_ranges():
    ids = list(range(1000))
    spans = list(sample_spans(ids, 20, 3, (16, 64), (8, 32)))
    assert spans == list(sample_spans(ids, 20, 3, (16, 64), (8, 32))) != list(sample_spans(ids, 20, 4, (16, 64), (8, 32)))
    for span, max_tokens in spans:
        assert 15 <= len(span) <= 63 and 8 <= max_tokens <= 32
        assert span == list(range(span[0], span[0] + len(span)))  # one contiguous cut


def test_make_workload_parses_like_preprocess_with_extra_inputs():
    items = make_workload(DEMO_TARGET, 3, 0, (32, 64), (8, 16), extra={"temperature": 0.5})
    assert len(items) == 3
    for it in items:
        assert it.params.max_tokens == it.max_tokens == it.params.min_tokens
        assert it.params.temperature == 0.5 and it.values()["temperature"] == 0.5
        assert 32 <= len(it.prompt_ids) <= 64 + 2

