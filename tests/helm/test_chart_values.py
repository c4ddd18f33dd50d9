"""values.schema.json and the chart's own checks: a wrong value fails with a message naming it; the
engine map covers every engine parameter the llm model reads; what the chart renders into the model
repository is read by the models, and anything else reaches their refusal."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.helm.chart import CHART, render, render_error

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


@pytest.mark.parametrize("setting, named", [
    ("engine.max_num_seq=8", "max_num_seq"),                      # a typo in an engine parameter
    ("engine.kv_cache_bytes=lots", "engine.kv_cache_bytes"),
    ("engine.gpu_memory_utilization=1.5", "engine.gpu_memory_utilization"),
    ("engine.dtype=fp8", "engine.dtype"),
    ("engine.model_path=/x", "model_path"),                       # paths come from model.*
    ("gpu.enabled=maybe", "gpu.enabled"),
    ("gpu.count=0", "gpu.count"),
    ("model.source=s3", "model.source"),
    ("model.pvc.mountPath=models", "model.pvc.mountPath"),
    ("autoscalling.enabled=true", "autoscalling"),                # a typo at the top level
    ("autoscaling.metric.nmae=x", "nmae"),
    ("probes.startup.failureTreshold=10", "failureTreshold"),
    ("service.type=Ingress", "service.type"),
    ("podDisruptionBudget.maxUnavailable=half", "podDisruptionBudget.maxUnavailable"),
    ("serviceMonitor.interval=15", "serviceMonitor.interval"),
    ("otel.endpoint=collector:4318", "otel.endpoint"),
    ("gateway.auth.secretName=abc", "secretName"),
    ("server.extraArgs[0]=log-verbose", "server.extraArgs"),
    ("extraOverrides[0]=model_path", "extraOverrides"),
    ("image.pullPolicy=Sometimes", "image.pullPolicy"),
])
def test_schema_rejects_a_wrong_value_naming_it(setting, named):
    err = render_error(setting)
    assert "values don't meet the specifications of the schema" in err, err
    assert named in err, err


@pytest.mark.parametrize("settings, message", [
    (("model.source=pvc",), "model.pvc.claimName: required when model.source is pvc"),
    (("gateway.auth.enabled=true",), "gateway.auth.enabled: needs gateway.enabled"),
    (("gateway.enabled=true", "gateway.auth.enabled=true"), "gateway.auth: set gateway.auth.existingSecret"),
    (("gateway.enabled=true", "gateway.auth.enabled=true", "gateway.auth.existingSecret=s",
      "gateway.auth.tokens[0]=t"), "either existingSecret or tokens"),
    (("terminationGracePeriodSeconds=149",), "terminationGracePeriodSeconds: 149 is shorter than"),
    (("model.source=pvc", "model.pvc.claimName=c", "engine.speculative_method=draft"), "model.draftPath: required"),
    (("gpu.enabled=false", "engine.device=cuda"), "engine.device: cuda needs gpu.enabled"),
    (("autoscaling.enabled=true", "autoscaling.minReplicas=5", "autoscaling.maxReplicas=2"),
     "autoscaling.minReplicas"),
])
def test_chart_checks_what_the_schema_cannot(settings, message):
    assert message in render_error(*settings)


def test_values_yaml_satisfies_its_own_schema_and_every_key_is_declared():
    """Every key of values.yaml is a property of the schema (so the schema documents all of them)."""
    def walk(values, schema, path):
        props = schema.get("properties", {})
        for key, value in values.items():
            assert key in props, f"{path}{key}: in values.yaml but not in values.schema.json"
            if isinstance(value, dict) and props[key].get("properties"):
                walk(value, props[key], f"{path}{key}.")
    walk(VALUES, SCHEMA, "")
    assert render()  # the defaults pass helm's schema check


def test_schema_closes_the_levels_that_matter():
    props = SCHEMA["properties"]
    assert SCHEMA["additionalProperties"] is False
    closed = ["image", "gpu", "model", "engine", "server", "service", "probes", "shutdown", "autoscaling",
              "serviceMonitor", "podDisruptionBudget", "otel", "gateway", "networkPolicy", "serviceAccount", "scratch"]
    for key in closed:
        assert props[key]["additionalProperties"] is False, key
    assert props["model"]["properties"]["pvc"]["additionalProperties"] is False
    assert props["gateway"]["properties"]["auth"]["additionalProperties"] is False
    assert props["autoscaling"]["properties"]["metric"]["additionalProperties"] is False
    for probe in ("startup", "readiness", "liveness"):
        assert props["probes"]["properties"][probe]["additionalProperties"] is False


def test_engine_map_covers_every_engine_parameter():
    """`engine:` accepts exactly the parameters the llm model reads (LLM_PARAMETERS: EngineConfig and
    SERVING_PARAMETERS) but the checkpoint paths (set from `model`) and the settings for tests only."""
    from backend.config import TEST_ONLY_PARAMETERS
    from backend.serving.llm_startup import LLM_PARAMETERS

    expected = set(LLM_PARAMETERS) - {"model_path", "draft_model_path"} - set(TEST_ONLY_PARAMETERS)
    declared = set(SCHEMA["properties"]["engine"]["properties"])
    assert declared == expected, (
        f"helm/triton-llm/values.schema.json engine properties differ from the llm model's parameters "
        f"(backend/serving/llm_startup.py LLM_PARAMETERS, less backend/config TEST_ONLY_PARAMETERS): "
        f"missing {sorted(expected - declared)}, unknown {sorted(declared - expected)}")
    assert set(TEST_ONLY_PARAMETERS) <= set(LLM_PARAMETERS)


def rendered_model_parameters(docs: list[dict], tmp_path) -> dict[str, dict[str, str]]:
    """Each model's config.pbtxt parameters once the launcher has applied a render's TRITON_LLM_SET."""
    from bench.harness.server import pbtxt_parameters
    from cli.launcher import render_model_repository
    from cli.serve import parse_overrides, settings_from_env
    from tests.helm.chart import container, env_of

    items, _ = settings_from_env(env_of(container(docs, "tritonserver")))
    repo = render_model_repository(tmp_path / "repo", parse_overrides(items))
    return {m: pbtxt_parameters((repo / m / "config.pbtxt").read_text()) for m in ("llm", "preprocess", "postprocess")}


def model_checks() -> dict:
    """model -> check(params): the refusal each model runs at load."""
    from backend.serving.llm_startup import LLM_PARAMETERS
    from contracts.triton_config import check_known_parameters
    from postprocess.serving import POSTPROCESS_PARAMETERS
    from preprocess.serving import PREPROCESS_PARAMETERS

    known = {"llm": LLM_PARAMETERS, "preprocess": PREPROCESS_PARAMETERS, "postprocess": POSTPROCESS_PARAMETERS}
    return {m: (lambda params, m=m: check_known_parameters(m, params, known[m])) for m in known}


SCENARIOS = sorted(p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml"))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_renders_only_parameters_the_models_read(scenario, tmp_path):
    params = rendered_model_parameters(render(scenario), tmp_path)
    for model, check in model_checks().items():
        check(params[model])


def test_extra_overrides_reach_the_models_refusal(tmp_path):
    """`extraOverrides`, past the schema, become TRITON_LLM_SET items; each model refuses what it does not read."""
    params = rendered_model_parameters(render(sets=(
        "extraOverrides[0]=llm.kv_cache_free_gpu_mem_fraction=0.9", "extraOverrides[1]=preprocess.no_such=1",
        "extraOverrides[2]=postprocess.no_such=1")), tmp_path)
    refused = {"llm": "kv_cache_free_gpu_mem_fraction", "preprocess": "no_such", "postprocess": "no_such"}
    for model, check in model_checks().items():
        with pytest.raises(ValueError, match=rf"^{refused[model]}: not a parameter of the {model} model \("):
            check(params[model])
        del params[model][refused[model]]
        check(params[model])   # the rest of the chart's render is known


def test_every_engine_parameter_renders(tmp_path):
    """A value for each engine key passes the schema and comes out as llm.KEY=VALUE."""
    from tests.helm.chart import container, env_of
    from cli.serve import parse_overrides, settings_from_env
    sample = {"block_size": 32, "num_kv_blocks": 4096, "kv_cache_bytes": "2GiB", "gpu_memory_utilization": 0.8,
              "max_num_seqs": 32, "max_queued_requests": 64, "max_num_batched_tokens": 2048, "max_model_len": 4096,
              "enable_prefix_caching": False, "watermark": 0.05, "stream_interval": 2, "device": "cuda:0",
              "dtype": "float16", "num_speculative_tokens": 3, "speculative_method": "ngram", "ngram_min": 2,
              "ngram_max": 5, "speculative_adaptive": False, "draft_coupling": "gumbel", "seed": 11, "stream_responses_per_s": 60,
              "quantization": "int8", "quantization_group_size": 64, "kv_cache_dtype": "int8", "fast_decode": True,
              "cpu_threads": 4, "cancel_poll_interval_s": 0.5, "metrics_interval_s": 2, "request_log_level": "warning",
              "engine_stall_timeout_s": 60, "engine_unhealthy_action": "fail_requests",
              "guided_compile_timeout_s": 5, "guided_compile_workers": 3, "guided_jump_forward": True,
              "python_switch_interval_ms": 0.5, "lora_adapters": "sql=/models/lora/sql,chat=/models/lora/chat",
              "lora_dir": "/models/lora", "max_loras": 2, "max_cpu_loras": 8, "max_lora_rank": 32}
    assert set(sample) == set(SCHEMA["properties"]["engine"]["properties"])
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"engine": sample}))
    items, _ = settings_from_env(env_of(container(render(str(values)), "tritonserver")))
    llm = parse_overrides(items)["llm"]
    expected = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in sample.items()}
    assert llm == expected
