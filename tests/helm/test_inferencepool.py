"""The OpenAI API and the InferencePool in the chart: the render validates against a schema of InferencePool v1
(tests/helm/schemas/inferencepool-v1.json, written from the Gateway API Inference Extension's API reference),
the check fails for a render missing each required part, and the pool selects the pods on the OpenAI port."""
from __future__ import annotations

import copy

import jsonschema
import pytest

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
