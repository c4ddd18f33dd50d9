"""The Helm chart helm/triton-llm: lint, render with the scenarios of ci/, validate every manifest
offline against the Kubernetes schemas (kubernetes-validate, strict), and check what it renders."""
from __future__ import annotations

import base64
import copy
import re
import shutil
import tempfile
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import ValidationError, all_versions

from tests.helm.chart import (
    check_inferencepool,
    CHART,
    CI_VALUES,
    K8S_VERSION,
    RELEASE,
    by_kind,
    container,
    env_of,
    files_with_string_literal,
    one,
    render,
    run_helm,
)
from cli.serve import drain_seconds_from_env, parse_overrides, settings_from_env
from cli.launcher import render_model_repository

SCENARIOS = ["default", "cpu", "pvc", "autoscaling", "gateway-secret", "gateway-tokens", "inferencepool"]
FULLNAME = f"{RELEASE}-triton-llm"
HEALTH = {"startupProbe": "/v2/health/ready", "readinessProbe": "/v2/health/ready"}
# Liveness is the launcher's stub watch (cli/liveness.py): Triton's /v2/health/live stays 200 with a dead stub.
LIVENESS = ["python3", "-m", "cli.liveness"]
# What the chart asks Prometheus / the HPA for: a family our llm model exports, with this label.
METRIC, METRIC_LABEL, METRIC_VALUE = "nv_trt_llm_request_metrics", "request_type", "waiting"


def scenario(name: str) -> list[dict]:
    return render() if name == "default" else render(name)


def validate(doc: dict) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_lint_strict():
    for extra in [[]] + [["-f", str(p)] for p in sorted(CI_VALUES.glob("*-values.yaml"))]:
        proc = run_helm("lint", "--strict", "--kube-version", K8S_VERSION, str(CHART), *extra)
        assert proc.returncode == 0, f"helm lint --strict {extra}:\n{proc.stdout}\n{proc.stderr}"
        assert "0 chart(s) failed" in proc.stdout


def test_every_ci_values_file_is_a_scenario():
    assert sorted(p.name for p in CI_VALUES.glob("*-values.yaml")) == sorted(
        f"{s}-values.yaml" for s in SCENARIOS if s != "default")


def test_kubernetes_validate_ships_the_pinned_version():
    assert K8S_VERSION.rsplit(".", 1)[0] in {v.rsplit(".", 1)[0] for v in all_versions()}, (
        f"kubernetes-validate has no schemas for Kubernetes {K8S_VERSION} (has {all_versions()}): "
        "pin a version it ships")


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_manifest_validates_against_the_kubernetes_schemas(name):
    docs = scenario(name)
    assert docs
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":  # a custom resource: no schema offline, asserted below
            continue
        if doc["kind"] == "InferencePool":  # a custom resource: its v1 schema is in tests/helm/schemas/
            check_inferencepool(doc)
            continue
        try:
            validate(doc)
        except ValidationError as e:
            pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']} at {'.'.join(map(str, e.path))}: {e.message}")


def test_the_validator_rejects_a_wrong_manifest():
    deployment = copy.deepcopy(one(render(), "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/x"
    with pytest.raises(ValidationError):
        validate(deployment)
    deployment = copy.deepcopy(one(render(), "Deployment"))
    deployment["spec"]["replicas"] = "one"
    with pytest.raises(ValidationError):
        validate(deployment)


@pytest.mark.parametrize("name", SCENARIOS)
def test_probes_ports_and_service(name):
    docs = scenario(name)
    triton = container(docs, "tritonserver")
    ports = {p["name"]: p["containerPort"] for p in triton["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    env = env_of(triton)
    assert (env["HTTP_PORT"], env["GRPC_PORT"], env["METRICS_PORT"]) == ("8000", "8001", "8002")
    for probe, path in HEALTH.items():
        assert triton[probe]["httpGet"] == {"path": path, "port": "http"}, probe
    assert triton["livenessProbe"]["exec"]["command"] == LIVENESS
    startup = triton["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # model load: 10 min at least
    assert "--no-gateway" in triton["args"]   # the launcher's own gateway would take the gateway container's port
    service = one(docs, "Service")
    named = {p["name"] for c in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    for p in service["spec"]["ports"]:
        assert p["targetPort"] in named, p
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


@pytest.mark.parametrize("name", SCENARIOS)
def test_security(name):
    docs = scenario(name)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for c in pod["containers"]:
        for m in c["volumeMounts"]:
            assert m["name"] in volumes, m
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container(docs, "tritonserver")["volumeMounts"]}
    for path in ("/tmp", "/home/triton-llm/.cache", "/opt/triton-llm/.cache"):
        assert "emptyDir" in mounts[path], path
    assert mounts["/dev/shm"]["emptyDir"]["medium"] == "Memory"
    sa = one(docs, "ServiceAccount")
    assert sa["automountServiceAccountToken"] is False and sa["metadata"]["name"] == pod["serviceAccountName"]


@pytest.mark.parametrize("name", SCENARIOS)
def test_graceful_termination(name):
    docs = scenario(name)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    triton = container(docs, "tritonserver")
    sleep = int(triton["lifecycle"]["preStop"]["exec"]["command"][1])
    assert triton["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep" and sleep > 0
    _, server_args = settings_from_env(env_of(triton))
    exit_timeout = [int(a.split("=")[1]) for a in server_args if a.startswith("--exit-timeout-secs=")]
    assert len(exit_timeout) == 1 and exit_timeout[0] > 0
    drain = drain_seconds_from_env(env_of(triton))  # the launcher drains in-flight streams on SIGTERM
    assert drain >= 60
    assert pod["terminationGracePeriodSeconds"] >= sleep + drain + exit_timeout[0]


def gpu_requests(docs: list[dict]) -> list:
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    return [(c["name"], kind, key) for c in pod["containers"] for kind in ("requests", "limits")
            for key in c.get("resources", {}).get(kind, {}) if "gpu" in key]


@pytest.mark.parametrize("name", SCENARIOS)
def test_gpu_only_in_gpu_mode(name):
    docs = scenario(name)
    triton = container(docs, "tritonserver")
    items, _ = settings_from_env(env_of(triton))
    if name == "cpu":
        assert gpu_requests(docs) == []
        assert env_of(triton)["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert "llm.device=cpu" in items
    else:
        assert sorted(gpu_requests(docs)) == [("tritonserver", "limits", "nvidia.com/gpu"),
                                              ("tritonserver", "requests", "nvidia.com/gpu")]
        assert triton["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert "NVIDIA_VISIBLE_DEVICES" not in env_of(triton)
        assert not any(i.startswith("llm.device=") for i in items)


def test_default_is_the_demo_in_the_image_with_one_replica():
    docs = render()
    assert sorted(by_kind(docs)) == ["Deployment", "PodDisruptionBudget", "Service", "ServiceAccount"]
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    triton = container(docs, "tritonserver")
    assert "TRITON_LLM_SET" not in env_of(triton)  # model_repository's config.pbtxt: models/demo-target
    assert triton["image"] == "triton-llm:0.1.0"
    assert [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]] == ["tritonserver"]
    # a chart upgrade that changes nothing in the pod must not restart it (model load is slow)
    assert not [k for k in deployment["spec"]["template"]["metadata"]["labels"] if k in ("helm.sh/chart",
                                                                                       "app.kubernetes.io/version")]
    assert deployment["spec"]["template"]["spec"]["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    assert {p["name"] for p in one(docs, "Service")["spec"]["ports"]} == {"http", "grpc", "metrics"}
    assert one(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


def test_pvc_model_reaches_the_model_repository(tmp_path):
    docs = render("pvc")
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    claim = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claim == [{"name": "model", "persistentVolumeClaim": {"claimName": "llm-checkpoints", "readOnly": True}}]
    mount = [m for m in container(docs, "tritonserver")["volumeMounts"] if m["name"] == "model"]
    assert mount == [{"name": "model", "mountPath": "/models", "readOnly": True}]
    items, _ = settings_from_env(env_of(container(docs, "tritonserver")))
    overrides = parse_overrides(items)
    ckpt = "/models/llama-3.2-1b-instruct"
    assert overrides["llm"] == {
        "model_path": ckpt, "draft_model_path": "/models/llama-3.2-1b-draft", "dtype": "bfloat16",
        "enable_prefix_caching": "true", "gpu_memory_utilization": "0.9", "kv_cache_bytes": "8GiB",
        "max_model_len": "8192", "max_num_batched_tokens": "4096", "max_num_seqs": "128",
        "num_speculative_tokens": "4", "speculative_method": "draft", "stream_interval": "4"}
    assert overrides["preprocess"] == {"tokenizer_path": ckpt, "max_model_len": "8192"}
    assert overrides["postprocess"] == {"tokenizer_path": ckpt, "max_states": "8192"}
    # the launcher renders them into a copy of the model repository (every model name exists)
    repo = render_model_repository(tmp_path / "repo", overrides)
    llm = (repo / "llm" / "config.pbtxt").read_text()
    assert f'key: "model_path" value: {{ string_value: "{ckpt}" }}' in llm
    assert 'key: "max_num_seqs" value: { string_value: "128" }' in llm
    preprocess = (repo / "preprocess" / "config.pbtxt").read_text()
    assert f'key: "tokenizer_path" value: {{ string_value: "{ckpt}" }}' in preprocess


def test_engine_numbers_render_as_the_launcher_reads_them(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text("engine:\n  kv_cache_bytes: 17179869184\n  watermark: 0.02\n  seed: 7\n"
                      "model:\n  path: /opt/models/my model\n")
    items, _ = settings_from_env(env_of(container(render(str(values)), "tritonserver")))
    llm = parse_overrides(items)["llm"]
    assert llm["kv_cache_bytes"] == "17179869184" and llm["watermark"] == "0.02" and llm["seed"] == "7"
    assert llm["model_path"] == "/opt/models/my model"
    assert llm["draft_model_path"] == "none"  # not the demo's draft (config.pbtxt's) for another checkpoint
    assert parse_overrides(items)["preprocess"] == {"tokenizer_path": "/opt/models/my model"}
    # values from --set arrive as int64 and strings; a quote in a value survives the shell-like split
    items, _ = settings_from_env(env_of(container(
        render(sets=("engine.max_num_seqs=256", "extraOverrides[0]=postprocess.max_states=it's")), "tritonserver")))
    assert "llm.max_num_seqs=256" in items and "postprocess.max_states=it's" in items


def test_metric_name_is_exported_by_our_llm_model():
    sources = files_with_string_literal(METRIC)
    assert sources, f"no Python source of the repository defines the metric family {METRIC!r} any more"
    text = "\n".join(p.read_text() for p in sources)
    for literal in (METRIC_LABEL, METRIC_VALUE):
        assert re.search(rf"""["']{literal}["']""", text), f"{literal!r} not in {sources}"
    values_metric = render("autoscaling")
    hpa = one(values_metric, "HorizontalPodAutoscaler")
    pods = hpa["spec"]["metrics"][0]["pods"]
    assert pods["metric"] == {"name": METRIC, "selector": {"matchLabels": {METRIC_LABEL: METRIC_VALUE}}}


def test_autoscaling_and_service_monitor():
    docs = render("autoscaling")
    deployment = one(docs, "Deployment")
    assert "replicas" not in deployment["spec"]  # the HPA owns the count
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": FULLNAME}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "4"}
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300

    sm = one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service = one(docs, "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["serving"]}
    [endpoint] = sm["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]} and endpoint["port"] == "metrics"
    assert endpoint["path"] == "/metrics"
    assert re.fullmatch(r"\d+s", endpoint["interval"]) and re.fullmatch(r"\d+s", endpoint["scrapeTimeout"])
    assert set(sm) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(sm["spec"]) == {"selector", "namespaceSelector", "endpoints"}
    assert set(endpoint) == {"port", "path", "interval", "scrapeTimeout"}

    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    env = env_of(container(docs, "tritonserver"))
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318"
    assert env["OTEL_SERVICE_NAME"] == FULLNAME


def test_no_otel_variables_without_an_endpoint():
    assert not [k for k in env_of(container(render(), "tritonserver")) if k.startswith("OTEL_")]


def gateway_checks(docs: list[dict], secret_name: str, key: str) -> None:
    gw = container(docs, "gateway")
    assert gw["command"][-3:] == ["python", "-m", "gateway"]
    args = " ".join(gw["args"])
    assert "--listen 0.0.0.0:50051" in args and "--triton-url localhost:8001" in args
    assert "--auth-token-file /etc/triton-llm/gateway/tokens" in args
    assert gw["ports"] == [{"name": "gateway", "containerPort": 50051, "protocol": "TCP"}]
    assert gw["readinessProbe"]["grpc"] == {"port": 50051}
    assert gw["livenessProbe"]["tcpSocket"] == {"port": "gateway"}
    assert "resources" in gw and gw["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    volume = [v for v in pod["volumes"] if v["name"] == "gateway-auth"]
    assert volume == [{"name": "gateway-auth", "secret": {"secretName": secret_name, "defaultMode": 0o440,
                                                          "items": [{"key": key, "path": "tokens"}]}}]
    mount = [m for m in gw["volumeMounts"] if m["name"] == "gateway-auth"]
    assert mount == [{"name": "gateway-auth", "mountPath": "/etc/triton-llm/gateway", "readOnly": True}]
    assert not [m for m in container(docs, "tritonserver")["volumeMounts"] if m["name"] == "gateway-auth"]
    # with auth on, no client reaches Triton's own ports through the Service
    assert sorted(p["name"] for p in one(docs, "Service")["spec"]["ports"]) == ["gateway", "metrics"]


def test_gateway_with_an_existing_secret_and_network_policy():
    docs = render("gateway-secret")
    gateway_checks(docs, "llm-gateway-tokens", "tokens.txt")
    assert "Secret" not in by_kind(docs)
    policy = one(docs, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    allowed = [sorted(p["port"] for p in rule["ports"]) for rule in policy["spec"]["ingress"]]
    assert allowed == [["gateway"], ["metrics"]]  # Triton's http/grpc: closed to other pods
    assert policy["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "apps"}


def test_gateway_with_tokens_from_values_creates_the_secret():
    docs = render("gateway-tokens")
    secret = one(docs, "Secret")
    gateway_checks(docs, secret["metadata"]["name"], "tokens")
    assert base64.b64decode(secret["data"]["tokens"]).decode() == "token-one\nit's-two\n"
    annotations = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert re.fullmatch(r"[0-9a-f]{64}", annotations["checksum/gateway-auth"])  # new tokens roll the pods
    assert "NetworkPolicy" not in by_kind(docs)


def test_gateway_without_auth_keeps_triton_ports():
    docs = render(sets=("gateway.enabled=true", "networkPolicy.enabled=true"))
    assert sorted(p["name"] for p in one(docs, "Service")["spec"]["ports"]) == ["gateway", "grpc", "http", "metrics"]
    assert "--auth-token-file" not in container(docs, "gateway")["args"]
    assert "Secret" not in by_kind(docs)
    allowed = [sorted(p["port"] for p in rule["ports"]) for rule in one(docs, "NetworkPolicy")["spec"]["ingress"]]
    assert allowed == [["gateway"], ["metrics"]]   # the Service lists Triton's ports; the policy admits the gateway
    for doc in docs:
        validate(doc)


def test_replica_count_and_pdb_and_pod_placement():
    docs = render(sets=("replicaCount=3", "podDisruptionBudget.maxUnavailable=25%", "runtimeClassName=nvidia",
                        "affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight=100",
                        ("affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]"
                         ".podAffinityTerm.topologyKey=kubernetes.io/hostname")))
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert one(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == "25%"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia" and "podAntiAffinity" in pod["affinity"]
    for doc in docs:
        validate(doc)
    assert "PodDisruptionBudget" not in by_kind(render(sets=("podDisruptionBudget.enabled=false",)))


def notes(tmp_path, *sets: str) -> str:
    """NOTES.txt as `helm install` prints it (helm template skips it: render it inside a ConfigMap)."""
    chart = Path(tempfile.mkdtemp(dir=tmp_path)) / "chart"
    shutil.copytree(CHART, chart)
    text = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "notes.yaml").write_text(
        '{{- define "notes" }}' + text + "{{- end }}\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data:\n  notes: {{ include "notes" . | toJson }}\n')
    args = ["template", RELEASE, str(chart), "-n", "serving", "--show-only", "templates/notes.yaml"]
    for s in sets:
        args += ["--set", s]
    proc = run_helm(*args)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)["data"]["notes"]


def test_notes_render_and_warn(tmp_path):
    text = notes(tmp_path)
    assert "port-forward svc/llm-triton-llm 8001:8001" in text and "WARNING" not in text
    text = notes(tmp_path, "gateway.enabled=true", "gateway.auth.enabled=true", "gateway.auth.existingSecret=s",
                 "autoscaling.enabled=true")
    assert "8001:8001" not in text and "50051:50051" in text
    assert "WARNING: the gateway's auth is on" in text and "prometheus-adapter" in text
    assert "WARNING" not in notes(tmp_path, "gateway.enabled=true", "gateway.auth.enabled=true",
                                  "gateway.auth.existingSecret=s", "networkPolicy.enabled=true")
