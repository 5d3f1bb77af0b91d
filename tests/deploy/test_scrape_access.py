"""Prometheus can scrape every component, and nothing else, under the rendered NetworkPolicies.

The chart is rendered (its defaults and every charts/magic/ci/ set, the ServiceMonitor on); for each
ServiceMonitor endpoint the Services it selects, their ports and the pods behind them are resolved
as the Prometheus Operator and Kubernetes do (label selectors, Service targetPort by name or number
against the pod's container ports), and the NetworkPolicies are evaluated with Kubernetes'
semantics (policies select pods by podSelector; a pod selected by no Ingress policy accepts
everything; otherwise a connection needs one rule whose `ports` (named ports resolved against the
target container's ports, endPort ranges, TCP by default) and `from` peers (podSelector within the
policy's namespace, namespaceSelector, both, ipBlock) admit it). Prometheus is a pod matching
networkPolicy.metricsIngressFrom, or, where that is empty, a pod of a `monitoring` namespace.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from .conftest import NAMESPACE, VALUE_SETS, value_set
from .test_chart import objects, render

pytestmark = pytest.mark.deploy

WORKLOADS = ("Deployment", "StatefulSet")


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    labels: dict
    namespace_labels: dict
    ports: dict = field(default_factory=dict)
    """Container ports: name -> number, for named-port resolution."""


def namespace_labels(name: str) -> dict:
    return {"kubernetes.io/metadata.name": name}


def selects(selector: dict | None, labels: dict) -> bool:
    """A Kubernetes LabelSelector: matchLabels and matchExpressions all hold ({} selects everything)."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def peer_admits(peer: dict, source: Pod, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        return False  # a pod's address is not known here: an ipBlock never stands for Prometheus
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], source.namespace_labels):
            return False
    elif source.namespace != policy_namespace:
        return False  # a podSelector alone selects pods of the policy's own namespace
    return "podSelector" not in peer or selects(peer["podSelector"], source.labels)


def port_admits(entry: dict, target: Pod, port: int) -> bool:
    if entry.get("protocol", "TCP") != "TCP":
        return False
    if "port" not in entry:
        return True
    first = entry["port"]
    if isinstance(first, str):
        if first not in target.ports:
            return False  # a named port the pod does not have matches nothing
        first = target.ports[first]
    return first <= port <= entry.get("endPort", first)


def admitted(policies: list[dict], source: Pod, target: Pod, port: int) -> bool:
    """Whether `source` may open a TCP connection to `target`:`port` under `policies`."""
    isolating = [
        p for p in policies
        if p["metadata"].get("namespace", NAMESPACE) == target.namespace
        and selects(p["spec"]["podSelector"], target.labels)
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
    ]
    if not isolating:
        return True
    for policy in isolating:
        for rule in policy["spec"].get("ingress") or []:
            ports_ok = not rule.get("ports") or any(port_admits(e, target, port) for e in rule["ports"])
            from_ok = not rule.get("from") or any(peer_admits(p, source, target.namespace) for p in rule["from"])
            if ports_ok and from_ok:
                return True
    return False


def pods(docs) -> list[Pod]:
    out = []
    for kind in WORKLOADS:
        for w in objects(docs, kind):
            if w["spec"].get("replicas", 1) == 0:
                continue
            template = w["spec"]["template"]
            ports = {p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", []) if "name" in p}
            out.append(Pod(w["metadata"]["name"], NAMESPACE, template["metadata"]["labels"], namespace_labels(NAMESPACE), ports))
    return out


def prometheus(values: dict) -> Pod:
    """A pod the values name as Prometheus (the first metricsIngressFrom peer), or, with none named,
    some pod of a `monitoring` namespace."""
    peers = values.get("networkPolicy", {}).get("metricsIngressFrom") or []
    if not peers:
        return Pod("prometheus-0", "monitoring", {"app.kubernetes.io/name": "prometheus"}, namespace_labels("monitoring"))
    peer = peers[0]
    assert "ipBlock" not in peer, "a value set naming Prometheus by address: give it a pod here"
    ns = peer.get("namespaceSelector", {}).get("matchLabels") or namespace_labels(NAMESPACE)
    name = ns.get("kubernetes.io/metadata.name", "monitoring")
    return Pod("prometheus-0", name, dict(peer.get("podSelector", {}).get("matchLabels") or {}), {**namespace_labels(name), **ns})


@dataclass(frozen=True)
class Target:
    pod: Pod
    port: int
    endpoint: str


def scrape_targets(docs) -> list[Target]:
    """Every (pod, port) the ServiceMonitor's endpoints make Prometheus scrape."""
    (monitor,) = objects(docs, "ServiceMonitor")
    spec = monitor["spec"]
    namespaces = spec.get("namespaceSelector", {}).get("matchNames") or [monitor["metadata"].get("namespace", NAMESPACE)]
    all_pods = pods(docs)
    out = []
    for service in objects(docs, "Service"):
        if NAMESPACE not in namespaces or not selects(spec["selector"], service["metadata"].get("labels", {})):
            continue
        for endpoint in spec["endpoints"]:
            for sp in service["spec"].get("ports", []):
                if sp.get("name") != endpoint["port"]:
                    continue
                for pod in all_pods:
                    if not all(pod.labels.get(k) == v for k, v in service["spec"]["selector"].items()):
                        continue
                    target = sp.get("targetPort", sp["port"])
                    number = pod.ports.get(target) if isinstance(target, str) else target
                    assert number, f"{service['metadata']['name']}: targetPort {target!r} is no port of {pod.name}"
                    out.append(Target(pod, number, f"{service['metadata']['name']}:{endpoint['port']}"))
    return out


def rendered_with_monitoring(chart, name: str) -> tuple[list[dict], dict]:
    values = value_set(name)
    values = {**values, "metrics": {**values.get("metrics", {}), "serviceMonitor": {**values.get("metrics", {}).get("serviceMonitor", {}), "enabled": True}}}
    return render(chart, values), values


@pytest.fixture(scope="module")
def monitored(chart):
    return {name: rendered_with_monitoring(chart, name) for name in VALUE_SETS}


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_component_has_a_scrape_target(monitored, name):
    docs, values = monitored[name]
    components = {t.pod.labels["app.kubernetes.io/component"] for t in scrape_targets(docs)}
    expected = {"controller", "rollout", "reward", "learner"}
    if values.get("codeJudge", {}).get("enabled", True):
        expected.add("codejudge")
    if values.get("redis", {}).get("enabled", True):
        expected.add("redis")  # the exporter sidecar (redis.metrics.enabled, on by default)
    assert components == expected


@pytest.mark.parametrize("name", VALUE_SETS)
def test_prometheus_is_admitted_to_every_scrape_target(monitored, name):
    docs, values = monitored[name]
    source = prometheus(values)
    policies = objects(docs, "NetworkPolicy")
    assert policies, "the value sets keep the NetworkPolicies on"
    for target in scrape_targets(docs):
        assert admitted(policies, source, target.pod, target.port), f"{name}: {source.namespace}/{source.labels} cannot scrape {target.endpoint} ({target.pod.name}:{target.port})"


@pytest.mark.parametrize("name", VALUE_SETS)
def test_prometheus_reaches_no_other_port(monitored, name):
    """Exactly the metrics ports: not the reward's POST /v1/score, not Redis, not vLLM's port, not
    the learner's weight or NCCL ports, whatever the pod declares or not."""
    docs, values = monitored[name]
    source = prometheus(values)
    policies = objects(docs, "NetworkPolicy")
    scraped = {(t.pod.name, t.port) for t in scrape_targets(docs)}
    for pod in pods(docs):
        component = pod.labels.get("app.kubernetes.io/component")
        if component not in {"controller", "rollout", "reward", "codejudge", "learner", "redis"}:
            continue
        for port in {*pod.ports.values(), 6379, 8000, 8701, 9600, 29600, 29601}:
            if (pod.name, port) in scraped:
                continue
            assert not admitted(policies, source, pod, port), f"{name}: Prometheus reaches {pod.name}:{port}, which is no metrics port"


@pytest.mark.parametrize("name", [n for n in VALUE_SETS if n != "restricted"])
def test_only_the_reward_pods_reach_the_code_judge(monitored, name):
    """POST /v1/judge runs submitted code: the release's reward pods reach it, no other pod of the
    release, and nobody outside."""
    docs, _ = monitored[name]
    policies = objects(docs, "NetworkPolicy")
    everyone = pods(docs)
    (judge,) = [p for p in everyone if p.labels.get("app.kubernetes.io/component") == "codejudge"]
    port = judge.ports["judge"]
    for source in everyone + [Pod("x", "default", {"app": "x"}, namespace_labels("default"))]:
        component = source.labels.get("app.kubernetes.io/component")
        assert admitted(policies, source, judge, port) is (component == "reward"), f"{name}: {source.name} -> the code judge"


def test_a_pod_outside_the_named_scrapers_reaches_no_metrics_port_of_the_reward(monitored):
    """With metricsIngressFrom set, the metrics ports are open to it alone."""
    docs, _ = monitored["gpu-7b"]
    stranger = Pod("x", "default", {"app": "x"}, namespace_labels("default"))
    reward = [t for t in scrape_targets(docs) if t.pod.labels["app.kubernetes.io/component"] == "reward"]
    assert reward and not any(admitted(objects(docs, "NetworkPolicy"), stranger, t.pod, t.port) for t in reward)


# -- the evaluator itself, on policies written for it ------------------------------------------------


def policy(pod_selector: dict, ingress: list | None, types=("Ingress",)) -> dict:
    spec = {"podSelector": pod_selector, "policyTypes": list(types)}
    if ingress is not None:
        spec["ingress"] = ingress
    return {"kind": "NetworkPolicy", "metadata": {"name": "p", "namespace": NAMESPACE}, "spec": spec}


WEB = Pod("web", NAMESPACE, {"app": "web"}, namespace_labels(NAMESPACE), {"metrics": 9400, "api": 8080})
MON = Pod("prom", "monitoring", {"app": "prom"}, namespace_labels("monitoring"))
LOCAL = Pod("peer", NAMESPACE, {"app": "prom"}, namespace_labels(NAMESPACE))


@pytest.mark.parametrize(
    "policies, source, port, expected",
    [
        ([], MON, 8080, True),  # no policy selects the pod: open
        ([policy({"matchLabels": {"app": "other"}}, [])], MON, 8080, True),
        ([policy({}, [])], MON, 9400, False),  # selected, no rule: closed
        ([policy({}, None, types=("Egress",))], MON, 9400, True),  # an egress-only policy does not isolate ingress
        ([policy({}, [{"ports": [{"port": "metrics"}]}])], MON, 9400, True),  # named port resolved
        ([policy({}, [{"ports": [{"port": "metrics"}]}])], MON, 8080, False),
        ([policy({}, [{"ports": [{"port": "score"}]}])], MON, 9400, False),  # a name the pod lacks
        ([policy({}, [{"ports": [{"port": 9000, "endPort": 9500}]}])], MON, 9400, True),
        ([policy({}, [{"ports": [{"port": 9400, "protocol": "UDP"}]}])], MON, 9400, False),
        ([policy({}, [{"from": [{"podSelector": {"matchLabels": {"app": "prom"}}}]}])], MON, 9400, False),  # other namespace
        ([policy({}, [{"from": [{"podSelector": {"matchLabels": {"app": "prom"}}}]}])], LOCAL, 9400, True),
        ([policy({}, [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]}])], MON, 9400, True),
        ([policy({}, [{"from": [{"namespaceSelector": {}, "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["x"]}]}}]}])], MON, 9400, False),
        ([policy({}, [{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}])], MON, 9400, False),
        ([policy({}, []), policy({}, [{"ports": [{"port": 9400}]}])], MON, 9400, True),  # policies add up
    ],
)
def test_network_policy_semantics(policies, source, port, expected):
    assert admitted(policies, source, WEB, port) is expected


def test_a_restricted_api_leaves_the_controller_scrapable(chart):
    """The controller's /metrics is on a port apart from its API: restricting the API to a
    namespace does not close the metrics to an unnamed Prometheus."""
    api_only = {"networkPolicy": {"apiIngressFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "users"}}}]},
                "metrics": {"serviceMonitor": {"enabled": True}}}
    docs = render(chart, api_only)
    policies = objects(docs, "NetworkPolicy")
    source = prometheus(api_only)
    controller = [t for t in scrape_targets(docs) if t.pod.labels.get("app.kubernetes.io/component") == "controller"]
    assert controller and all(admitted(policies, source, t.pod, t.port) for t in controller)
