"""The chart's NetworkPolicy (``networkPolicy.enabled``), read from the render: with the gateway on, Triton's
HTTP/gRPC ports (8000/8001) admit no other pod (the gateway reaches them over localhost) unless ``tritonFrom``
lists direct clients; the metrics port (8002) admits the monitoring and router selectors; the gateway's ports
admit ``from`` and the router. Every render validates against the Kubernetes schemas."""
from __future__ import annotations

import kubernetes_validate

from tests.helm.chart import K8S_VERSION, by_kind, one, render, render_error

APPS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}
MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
ROUTER = {"podSelector": {"matchLabels": {"app": "epp"}}}
DIRECT = {"podSelector": {"matchLabels": {"role": "trtllm-client"}}}


def selector_sets(prefix: str, peer: dict) -> list[str]:
    """``--set`` arguments for one peer of list ``prefix`` (e.g. networkPolicy.from[0])."""
    (kind, sel), = peer.items()
    (key, value), = sel["matchLabels"].items()
    return [f"{prefix}.{kind}.matchLabels.{key.replace('.', chr(92) + '.')}={value}"]


def policy(*sets: str) -> dict:
    docs = render(sets=("networkPolicy.enabled=true", *sets))
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    return one(docs, "NetworkPolicy")


def rules(pol: dict) -> dict[tuple[str, ...], list[dict] | None]:
    """ports of each ingress rule -> its peers (None: any peer)."""
    return {tuple(sorted(p["port"] for p in r["ports"])): r.get("from") for r in pol["spec"]["ingress"]}


GATEWAY_ON = ("gateway.enabled=true", "gateway.openai.enabled=true", "gateway.auth.enabled=true",
              "gateway.auth.tokens[0]=t", *selector_sets("networkPolicy.from[0]", APPS),
              *selector_sets("networkPolicy.metricsFrom[0]", MONITORING),
              *selector_sets("networkPolicy.routerFrom[0]", ROUTER))


def test_triton_ports_admit_the_gateway_only_and_metrics_the_monitoring_and_router_selectors():
    pol = policy(*GATEWAY_ON)
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    assert rules(pol) == {("gateway", "openai"): [APPS, ROUTER], ("metrics",): [MONITORING, ROUTER]}
    assert not any({"http", "grpc"} & set(ports) for ports in rules(pol))   # 8000/8001: no other pod


def test_the_same_without_auth():
    pol = policy(*[s for s in GATEWAY_ON if not s.startswith("gateway.auth")])
    assert rules(pol) == {("gateway", "openai"): [APPS, ROUTER], ("metrics",): [MONITORING, ROUTER]}


def test_direct_clients_are_a_choice_of_their_own():
    pol = policy(*GATEWAY_ON, *selector_sets("networkPolicy.tritonFrom[0]", DIRECT))
    assert rules(pol)[("grpc", "http")] == [DIRECT]
    assert rules(pol)[("metrics",)] == [MONITORING, ROUTER]


def test_without_the_gateway_triton_ports_are_the_serving_ports():
    pol = policy(*selector_sets("networkPolicy.from[0]", APPS), *selector_sets("networkPolicy.metricsFrom[0]",
                                                                                MONITORING))
    assert rules(pol) == {("grpc", "http"): [APPS], ("metrics",): [MONITORING]}


def test_empty_selectors_admit_any_peer_and_off_renders_nothing():
    assert rules(policy("gateway.enabled=true")) == {("gateway",): None, ("metrics",): None}
    assert "NetworkPolicy" not in by_kind(render(sets=("gateway.enabled=true",)))


def test_the_values_schema_knows_every_field():
    error = render_error("networkPolicy.enabled=true", "networkPolicy.routersFrom[0].podSelector.matchLabels.a=b")
    assert "routersFrom" in error
