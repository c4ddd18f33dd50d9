"""The OpenAI API and the InferencePool in the chart: the render validates against a schema of InferencePool v1
(tests/helm/schemas/inferencepool-v1.json, written from the Gateway API Inference Extension's API reference),
the check fails for a render missing each required part, and the pool selects the pods on the OpenAI port."""
from __future__ import annotations

import copy
import re

import jsonschema
import pytest
import yaml

from tests.helm.chart import check_inferencepool, container, one, render, render_error

ENGINE_LABEL = ("llm-d.ai/engine-type", "triton-tensorrt-llm")


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return render("inferencepool")


def test_the_inferencepool_render_is_valid_v1(docs):
    pool = one(docs, "InferencePool")
    check_inferencepool(pool)
    assert pool["spec"]["endpointPickerRef"]["name"] == "llm-epp"


@pytest.mark.parametrize("path", [("spec", "selector"), ("spec", "targetPorts"), ("spec", "endpointPickerRef"),
                                  ("spec", "selector", "matchLabels"), ("spec", "endpointPickerRef", "port"),
                                  ("spec", "endpointPickerRef", "name")])
def test_the_check_fails_without_each_required_part(docs, path):
    broken = copy.deepcopy(one(docs, "InferencePool"))
    node = broken
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    with pytest.raises(jsonschema.ValidationError):
        check_inferencepool(broken)


def test_the_check_fails_for_bad_values(docs):
    pool = one(docs, "InferencePool")
    for mutate in (lambda d: d["spec"]["targetPorts"].append(dict(d["spec"]["targetPorts"][0])),
                   lambda d: d["spec"]["targetPorts"].clear(),
                   lambda d: d["spec"]["targetPorts"][0].update(number=70000),
                   lambda d: d["spec"]["endpointPickerRef"].update(failureMode="Sometimes"),
                   lambda d: d.update(apiVersion="inference.networking.x-k8s.io/v1alpha2")):
        broken = copy.deepcopy(pool)
        mutate(broken)
        with pytest.raises(jsonschema.ValidationError):
            check_inferencepool(broken)


def test_the_pool_selects_the_pods_on_the_openai_port(docs):
    pool = one(docs, "InferencePool")
    pod = one(docs, "Deployment")["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert ENGINE_LABEL in labels.items()
    assert set(pool["spec"]["selector"]["matchLabels"].items()) <= set(labels.items())
    gw = container(docs, "gateway")
    openai_port = [p for p in gw["ports"] if p["name"] == "openai"][0]["containerPort"]
    assert pool["spec"]["targetPorts"] == [{"number": openai_port}]
    assert gw["args"][gw["args"].index("--openai-listen") + 1] == f"0.0.0.0:{openai_port}"
    assert gw["args"][gw["args"].index("--triton-metrics-url") + 1] == "http://localhost:8002/metrics"
    service = one(docs, "Service")
    assert "openai" in {p["name"] for p in service["spec"]["ports"]}


def test_without_the_pool_the_api_is_off_and_no_engine_label():
    docs = render()
    assert not [d for d in docs if d["kind"] == "InferencePool"]
    assert ENGINE_LABEL not in one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"].items()


def test_the_pool_needs_the_openai_api_and_a_picker():
    assert "gateway.openai.enabled" in render_error("inferencePool.enabled=true",
                                                    "inferencePool.endpointPicker.serviceName=epp")
    assert "serviceName" in render_error("inferencePool.enabled=true", "gateway.enabled=true",
                                         "gateway.openai.enabled=true")


def test_notes_name_the_openai_port_and_the_pool(tmp_path):
    from tests.helm.test_chart import notes

    text = notes(tmp_path, "gateway.enabled=true", "gateway.openai.enabled=true", "inferencePool.enabled=true",
                 "inferencePool.endpointPicker.serviceName=epp")
    assert "port-forward svc/llm-triton-llm 9000:9000" in text and "InferencePool llm-triton-llm" in text
    assert "9000" not in notes(tmp_path)


PICKER_SPECS = ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "loraSpec", "cacheBlockSizeSpec",
                "cacheNumBlocksSpec")


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``name{label=value,...}`` (llm-d's metric spec: a PromQL selector of equality matchers, quotes optional)
    as the family name and its labels; raises ``ValueError`` for anything else."""
    match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?", spec.strip())
    if match is None:
        raise ValueError(f"not a metric spec: {spec!r}")
    labels = {}
    for pair in filter(None, (match.group(2) or "").split(",")):
        matcher = re.fullmatch(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*("[^"]*"|[^"=!~\s]+)\s*', pair)
        if matcher is None:
            raise ValueError(f"not an equality matcher: {pair!r} in {spec!r}")
        labels[matcher.group(1)] = matcher.group(2).strip('"')
    return match.group(1), labels


def picker_config(docs: list[dict] | None = None) -> dict:
    """The EndpointPickerConfig in the chart's ``<release>-epp-config`` ConfigMap."""
    maps = [d for d in (docs or render("inferencepool")) if d["kind"] == "ConfigMap"
            and d["metadata"]["name"].endswith("-epp-config")]
    assert len(maps) == 1, "the pool's render has one picker ConfigMap"
    return yaml.safe_load(maps[0]["data"]["triton-llm-plugins.yaml"])


def picker_engine_config(docs: list[dict] | None = None) -> dict:
    extractor = [p for p in picker_config(docs)["plugins"] if p["type"] == "core-metrics-extractor"]
    assert len(extractor) == 1
    params = extractor[0]["parameters"]
    engines = {e["name"]: e for e in params["engineConfigs"]}
    assert params["defaultEngine"] == ENGINE_LABEL[1] and ENGINE_LABEL[1] in engines
    return engines[ENGINE_LABEL[1]]


def test_the_picker_config_names_our_lora_gauge_for_the_pods_engine_type(docs):
    from backend.serving.lora_metrics import LORA_INFO_FAMILY
    from backend.serving.metrics import KV_FAMILY, REQUEST_FAMILY

    config = picker_config(docs)
    assert (config["apiVersion"], config["kind"]) == ("inference.networking.x-k8s.io/v1alpha1", "EndpointPickerConfig")
    declared = {p["type"] for p in config["plugins"]}
    assert {"lora-affinity-scorer", "metrics-data-source", "core-metrics-extractor"} <= declared
    for profile in config["schedulingProfiles"]:
        assert {p["pluginRef"] for p in profile["plugins"]} <= declared
    engine = picker_engine_config(docs)
    families = {key: parse_spec(engine[key])[0] for key in PICKER_SPECS}
    assert families.pop("loraSpec") == LORA_INFO_FAMILY
    assert families == {"queuedRequestsSpec": REQUEST_FAMILY, "runningRequestsSpec": REQUEST_FAMILY,
                        "kvUsageSpec": KV_FAMILY, "cacheBlockSizeSpec": KV_FAMILY, "cacheNumBlocksSpec": KV_FAMILY}


def test_parse_spec_refuses_what_is_not_a_selector():
    assert parse_spec("a_b{x=y, z=\"w\"}") == ("a_b", {"x": "y", "z": "w"})
    for bad in ("", "a{x}", "a{x=~y}", "1abc", "a{x=y"):
        with pytest.raises(ValueError):
            parse_spec(bad)


def test_the_picker_config_can_be_left_out():
    docs = render("inferencepool", sets=("inferencePool.endpointPicker.pluginsConfig=false",))
    assert not [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-epp-config")]
