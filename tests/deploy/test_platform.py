"""The chart as a platform team reviews it before installing: GitOps-stable secrets, upgrades that
restart only what changed, disruption budgets and grace periods, a `helm test` hook, network
boundaries with no accidental "from anyone", the scheduling knobs production clusters need, and
the ServiceMonitor and PrometheusRule valid for the Prometheus Operator."""

from __future__ import annotations

import base64
import importlib.util
import json
import shutil

import pytest
import yaml

from .conftest import CHART, NAMESPACE, RELEASE, VALUE_SETS, value_set
from .test_chart import container, env, objects, one, render, secret_file

pytestmark = pytest.mark.deploy

ROLES = ("controller", "rollout", "reward", "learner")

HOOK = "helm.sh/hook"


def workloads(docs) -> dict[str, dict]:
    """component -> pod template of every Deployment/StatefulSet (hooks and test pods excluded)."""
    out = {}
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            out[d["metadata"]["labels"]["app.kubernetes.io/component"]] = d["spec"]["template"]
    return out


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, CHART / "files" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- secrets --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", VALUE_SETS)
def test_two_gitops_renders_are_identical(chart, name):
    """`helm template` twice (Argo CD, Flux): nothing random, so the same Secrets and checksums."""
    first, second = render(chart, value_set(name)), render(chart, value_set(name))
    assert first == second
    assert [s for s in objects(first, "Secret")] == [s for s in objects(second, "Secret")]


def test_generated_secrets_come_from_a_hook_job_that_keeps_existing_ones(chart):
    docs = render(chart, {})
    job = one(docs, "Job", f"{RELEASE}-magic-secrets")
    assert job["metadata"]["annotations"][HOOK] == "pre-install,pre-upgrade"
    spec = job["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is True and spec["serviceAccountName"] == f"{RELEASE}-magic-secrets"
    assert spec["securityContext"]["runAsNonRoot"] is True
    c = spec["containers"][0]
    assert c["command"] == ["python3", "/scripts/ensure_secrets.py"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]} and c["securityContext"]["readOnlyRootFilesystem"] is True
    script = one(docs, "ConfigMap", f"{RELEASE}-magic-secrets")["data"]["ensure_secrets.py"]
    assert script == (CHART / "files" / "ensure_secrets.py").read_text().rstrip("\n")
    role = one(docs, "Role", f"{RELEASE}-magic-secrets")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
         "resourceNames": [f"{RELEASE}-magic-auth", f"{RELEASE}-magic-redis", f"{RELEASE}-magic-codejudge-token", *(f"{RELEASE}-magic-redis-{role}" for role in ROLES)]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]
    for kind in ("ServiceAccount", "Role", "RoleBinding", "ConfigMap"):  # exist before the Job runs
        hooked = one(docs, kind, f"{RELEASE}-magic-secrets")["metadata"]["annotations"]
        assert hooked[HOOK] == "pre-install,pre-upgrade" and int(hooked["helm.sh/hook-weight"]) < int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    # every other pod keeps the token unmounted
    for component, template in workloads(docs).items():
        assert template["spec"]["automountServiceAccountToken"] is False, component


def test_given_or_existing_secrets_need_no_hook(chart):
    acl = {role: f"{role}-pw" for role in ROLES}  # the services' Redis users' passwords
    given = render(chart, {"auth": {"apiToken": "t" * 24}, "redis": {"auth": {"password": "p-ass.word_1"}, "acl": {"passwords": acl}},
                           "codeJudge": {"tokenSecret": {"name": "judge-token"}}})
    assert not objects(given, "Job")
    assert base64.b64decode(one(given, "Secret", f"{RELEASE}-magic-auth")["data"]["api-token"]) == b"t" * 24
    assert all(base64.b64decode(one(given, "Secret", f"{RELEASE}-magic-redis-{r}")["data"]["redis-password"]) == p.encode() for r, p in acl.items())
    only_token = render(chart, {"auth": {"apiToken": "t" * 24}})
    (job,) = objects(only_token, "Job")
    assert json.loads(env(job["spec"]["template"]["spec"]["containers"][0])["MAGIC_SECRETS"]) == [
        {"name": f"{RELEASE}-magic-redis", "key": "redis-password", "length": 32},
        {"name": f"{RELEASE}-magic-codejudge-token", "key": "api-token", "length": 32},  # the code judge's own token
        *({"name": f"{RELEASE}-magic-redis-{role}", "key": "redis-password", "length": 32} for role in ROLES),
    ]
    (job,) = objects(render(chart, value_set("external-redis")), "Job")  # every other Secret given: only the judge's is generated
    assert json.loads(env(job["spec"]["template"]["spec"]["containers"][0])["MAGIC_SECRETS"]) == [
        {"name": f"{RELEASE}-magic-codejudge-token", "key": "api-token", "length": 32}]


def test_generated_secret_is_owned_by_the_release_and_url_safe():
    ensure = load_script("ensure_secrets")
    value = ensure.random_value(32)
    assert len(value) == 32 and value.isalnum() and ensure.random_value(32) != value
    manifest = ensure.secret_manifest("rl-magic-redis", "redis-password", value, "ml", "rl", {"app.kubernetes.io/instance": "rl"})
    assert base64.b64decode(manifest["data"]["redis-password"]).decode() == value
    # what Helm checks before adopting an existing object into the release
    assert manifest["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert manifest["metadata"]["annotations"]["meta.helm.sh/release-name"] == "rl"
    assert manifest["metadata"]["annotations"]["meta.helm.sh/release-namespace"] == "ml"
    # kept by GitOps tools, though it carries the release's tracking label and is in no rendered manifest
    annotations = manifest["metadata"]["annotations"]
    assert annotations["argocd.argoproj.io/compare-options"] == "IgnoreExtraneous"
    assert annotations["argocd.argoproj.io/sync-options"] == "Prune=false"
    assert annotations["kustomize.toolkit.fluxcd.io/prune"] == "disabled"
    assert annotations["helm.sh/resource-policy"] == "keep"


# -- upgrades -----------------------------------------------------------------------------------


def test_a_chart_version_bump_restarts_no_pod(chart, tmp_path):
    import helm_python as helm

    bumped = tmp_path / "magic"
    shutil.copytree(CHART, bumped)
    meta = yaml.safe_load((bumped / "Chart.yaml").read_text())
    meta["version"] = "9.9.9"
    (bumped / "Chart.yaml").write_text(yaml.safe_dump(meta))
    for name in VALUE_SETS:
        with helm.Chart.load(bumped) as c:
            after = workloads(render(c, value_set(name)))
        assert after == workloads(render(chart, value_set(name))), name


@pytest.mark.parametrize("component", ["controller", "rollout", "reward", "learner", "redis"])
def test_an_image_change_restarts_only_that_component(chart, component):
    before = workloads(render(chart, {"auth": {"apiToken": "t" * 24}}))
    after = workloads(render(chart, {"auth": {"apiToken": "t" * 24}, component: {"image": {"tag": "9.9.9"}}}))
    changed = {c for c in before if before[c] != after[c]}
    assert changed == ({"reward", "codejudge"} if component == "reward" else {component})  # the code judge runs from the reward image


def test_a_redis_password_change_restarts_redis_and_its_clients_but_a_token_change_only_the_token_holders(chart):
    base = workloads(render(chart, {"auth": {"apiToken": "t" * 24}, "redis": {"auth": {"password": "one-password"}}}))
    password = workloads(render(chart, {"auth": {"apiToken": "t" * 24}, "redis": {"auth": {"password": "another-password"}}}))
    token = workloads(render(chart, {"auth": {"apiToken": "u" * 24}, "redis": {"auth": {"password": "one-password"}}}))
    assert {c for c in base if base[c] != password[c]} == {"controller", "rollout", "reward", "learner", "redis"}  # the code judge has no Redis
    # the controller's API and the reward pods' POST /v1/score check the token (the code judge has a token of its own)
    assert {c for c in base if base[c] != token[c]} == {"controller", "reward"}


def test_a_rollout_update_needs_no_spare_gpu(chart):
    rollout = one(render(chart, {}), "Deployment", f"{RELEASE}-magic-rollout")
    assert rollout["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    recreate = one(render(chart, {"rollout": {"updateStrategy": {"type": "Recreate"}}}), "Deployment", f"{RELEASE}-magic-rollout")
    assert recreate["spec"]["strategy"] == {"type": "Recreate"}


def test_disruption_budgets_and_grace_periods(chart):
    docs = render(chart, {})
    budgets = {p["metadata"]["name"]: p["spec"] for p in objects(docs, "PodDisruptionBudget")}
    # only the CPU pods (reward, code judge) have one: an evicted GPU pod waits for a free GPU, so a
    # budget on the rollout pods would hold a node's drain until the drained node came back (docs/deploy.md)
    assert set(budgets) == {f"{RELEASE}-magic-reward", f"{RELEASE}-magic-codejudge"}
    spec = budgets[f"{RELEASE}-magic-reward"]
    assert spec["maxUnavailable"] == 1 and spec["selector"]["matchLabels"]["app.kubernetes.io/component"] == "reward"
    # a pod that is not Ready (Redis down, say) never holds a drain
    assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    spare = render(chart, {"rollout": {"podDisruptionBudget": {"enabled": True, "maxUnavailable": "50%", "unhealthyPodEvictionPolicy": "IfHealthyBudget"}}})
    rollout = one(spare, "PodDisruptionBudget", f"{RELEASE}-magic-rollout")["spec"]
    assert rollout["maxUnavailable"] == "50%" and rollout["unhealthyPodEvictionPolicy"] == "IfHealthyBudget"
    grace = {c: t["spec"]["terminationGracePeriodSeconds"] for c, t in workloads(docs).items()}
    assert grace == {"controller": 30, "rollout": 60, "reward": 60, "codejudge": 60, "learner": 120, "redis": 60}
    frozen = render(chart, {"learner": {"podDisruptionBudget": {"enabled": True, "maxUnavailable": 0}}})
    assert one(frozen, "PodDisruptionBudget", f"{RELEASE}-magic-learner")["spec"]["maxUnavailable"] == 0


def test_helm_test_hook_checks_controller_redis_and_token(chart):
    docs = render(chart, {"networkPolicy": {"apiIngressFrom": [{"namespaceSelector": {"matchLabels": {"team": "ml"}}}]}})
    pod = one(docs, "Pod", f"{RELEASE}-magic-test")
    assert pod["metadata"]["annotations"][HOOK] == "test"
    c = pod["spec"]["containers"][0]
    assert c["command"] == ["python3", "/scripts/smoke_test.py"]
    e = env(c)
    assert e["MAGIC_API"] == f"http://{RELEASE}-magic-controller:8080"
    assert secret_file(pod["spec"], c, "MAGIC_API_TOKEN") == {"name": f"{RELEASE}-magic-auth", "key": "api-token"}
    assert e["MAGIC_REDIS_URL"] == f"redis://{RELEASE}-magic-redis:6379/0"  # the default user: its password is a file
    assert secret_file(pod["spec"], c, "MAGIC_REDIS_PASSWORD") == {"name": f"{RELEASE}-magic-redis", "key": "redis-password"}
    assert one(docs, "ConfigMap", f"{RELEASE}-magic-test")["data"]["smoke_test.py"] == (CHART / "files" / "smoke_test.py").read_text().rstrip("\n")
    # the NetworkPolicies let the test pod in (it runs in the release's namespace), though the API is restricted
    assert pod["metadata"]["namespace"] == NAMESPACE
    assert NAMESPACE in api_namespaces(one(docs, "NetworkPolicy", f"{RELEASE}-magic-controller"))
    redis_from = one(docs, "NetworkPolicy", f"{RELEASE}-magic-redis")["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"]
    assert "test" in next(x for x in redis_from if x["key"] == "app.kubernetes.io/component")["values"]


# -- network boundaries -----------------------------------------------------------------------------

API_ONLY = {"networkPolicy": {"apiIngressFrom": [{"namespaceSelector": {"matchLabels": {"team": "ml"}}}]}}
METRICS_ONLY = {"networkPolicy": {"metricsIngressFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]}}
POLICY_CASES = {**{n: value_set(n) for n in VALUE_SETS}, "api-only": API_ONLY, "metrics-only": METRICS_ONLY}


@pytest.mark.parametrize("case", POLICY_CASES)
def test_no_port_is_open_to_everyone_by_accident(chart, case):
    """An ingress rule without `from` admits every pod of the cluster. Only ports that serve nothing
    but metrics may have one; never the controller's API (named namespaces only)."""
    values = POLICY_CASES[case]
    for policy in objects(render(chart, values), "NetworkPolicy"):
        component = policy["metadata"]["labels"].get("app.kubernetes.io/component", "default-deny")
        for rule in policy["spec"].get("ingress", []):
            if "from" in rule:
                assert rule["from"], (case, component, rule)
                continue
            ports = [p["port"] for p in rule.get("ports", [])]
            assert ports, f"{case}: {component} admits every pod on every port"
            assert component in ("controller", "rollout", "learner", "reward", "codejudge", "redis") and ports == ["metrics"], f"{case}: {component} port {ports} open to every pod"


def api_namespaces(policy) -> list[str]:
    """The namespaces whose pods the controller's policy admits to the API port (by name)."""
    (rule,) = [r for r in policy["spec"]["ingress"] if r["ports"] == [{"port": "http"}] and "namespaceSelector" in r["from"][0]]
    (expr,) = rule["from"][0]["namespaceSelector"]["matchExpressions"]
    assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "In"
    return expr["values"]


def test_the_api_is_reachable_from_named_namespaces_only(chart):
    policy = one(render(chart, {}), "NetworkPolicy", f"{RELEASE}-magic-controller")
    assert api_namespaces(policy) == [NAMESPACE]
    api_rules = [r for r in policy["spec"]["ingress"] if r.get("ports") == [{"port": "http"}]]
    assert [p for r in api_rules for p in r["from"]] == [api_rules[0]["from"][0]]  # nobody else on the API port
    wider = one(render(chart, {"networkPolicy": {"apiIngressNamespaces": ["ml-users", NAMESPACE]}}), "NetworkPolicy", f"{RELEASE}-magic-controller")
    assert api_namespaces(wider) == [NAMESPACE, "ml-users"]


def test_default_deny_covers_every_pod_of_the_release(chart):
    """Hook and test pods included: each pod is selected by the default-deny policy, which admits nothing."""
    docs = render(chart, {})
    deny = one(docs, "NetworkPolicy", f"{RELEASE}-magic-default-deny")["spec"]
    assert deny["policyTypes"] == ["Ingress"] and not deny.get("ingress")
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] in ("Deployment", "StatefulSet", "Job")]
    pods += [d["metadata"]["labels"] for d in objects(docs, "Pod")]
    assert len(pods) == 8  # controller, rollout, reward, code judge, learner, redis, the secrets Job, the helm test
    for labels in pods:
        assert all(labels.get(k) == v for k, v in deny["podSelector"]["matchLabels"].items()), labels
    assert not objects(render(chart, {"networkPolicy": {"defaultDeny": False}}), "NetworkPolicy", f"{RELEASE}-magic-default-deny")


@pytest.mark.parametrize("case", POLICY_CASES)
def test_reward_scoring_port_is_reachable_only_from_named_peers(chart, case):
    values = POLICY_CASES[case]
    np = values.get("networkPolicy", {})
    ingress = one(render(chart, values), "NetworkPolicy", f"{RELEASE}-magic-reward")["spec"]["ingress"]
    score = [rule for rule in ingress if {"port": "score"} in rule["ports"]]
    if np.get("scoreIngressFrom"):
        assert score == [{"ports": [{"port": "score"}], "from": np["scoreIngressFrom"]}]
    else:
        assert score == []  # nobody
    assert all(rule["ports"] == [{"port": "metrics"}] for rule in ingress if rule not in score)  # Prometheus: that port alone


# -- scheduling knobs ---------------------------------------------------------------------------------

PRODUCTION = {
    "priorityClassName": "ml-high",
    "schedulerName": "volcano",
    "controller": {"image": {"digest": "sha256:" + "a" * 64}, "nodeSelector": {"pool": "cpu"}},
    "rollout": {
        "gpuResourceName": "amd.com/gpu",
        "priorityClassName": "ml-rollout",
        "tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
                                       "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "rollout"}}}],
        "extraVolumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "hf-cache"}}],
        "extraVolumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
    },
    "learner": {"gpuResourceName": "nvidia.com/mig-3g.40gb", "schedulerName": "default-scheduler", "terminationGracePeriodSeconds": 900},
    "reward": {"extraVolumes": [{"name": "ca", "configMap": {"name": "corp-ca"}}], "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corp"}]},
    "codeJudge": {"nodeSelector": {"pool": "sandbox"}, "tolerations": [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}], "schedulerName": "default-scheduler"},
    "redis": {"image": {"digest": "sha256:" + "b" * 64}, "priorityClassName": "system-ish"},
}


def test_production_scheduling_values_render_and_validate(chart):
    import kubernetes_validate

    chart.validate_schema(chart.merge_values(PRODUCTION))
    docs = render(chart, PRODUCTION)
    for doc in docs:
        if doc["kind"] not in ("ServiceMonitor", "PrometheusRule"):
            for kube in ("1.27.0", "1.35.0"):
                kubernetes_validate.validate(doc, kube, strict=True)
    t = workloads(docs)
    assert t["controller"]["spec"]["containers"][0]["image"] == "ghcr.io/magic-rl/magic-controller:0.1.0@sha256:" + "a" * 64
    assert t["redis"]["spec"]["containers"][0]["image"].endswith("@sha256:" + "b" * 64)
    assert t["controller"]["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert {c: t[c]["spec"]["priorityClassName"] for c in t} == {"controller": "ml-high", "rollout": "ml-rollout", "reward": "ml-high", "codejudge": "ml-high", "learner": "ml-high", "redis": "system-ish"}
    assert {c: t[c]["spec"]["schedulerName"] for c in t} == {"controller": "volcano", "rollout": "volcano", "reward": "volcano", "codejudge": "default-scheduler", "learner": "default-scheduler", "redis": "volcano"}
    assert t["codejudge"]["spec"]["nodeSelector"] == {"pool": "sandbox"}  # a node pool of its own
    rollout = t["rollout"]["spec"]
    vllm = container(rollout, "vllm")
    assert vllm["resources"]["limits"]["amd.com/gpu"] == 1 and "nvidia.com/gpu" not in vllm["resources"]["limits"]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in vllm["volumeMounts"]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in container(rollout, "rollout")["volumeMounts"]
    assert rollout["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    learner = t["learner"]["spec"]
    assert container(learner, "learner")["resources"]["requests"]["nvidia.com/mig-3g.40gb"] == 1
    assert learner["terminationGracePeriodSeconds"] == 900
    assert {"name": "ca", "configMap": {"name": "corp-ca"}} in t["reward"]["spec"]["volumes"]


INVALID = [
    ({"controller": {"image": {"digest": "latest"}}}, "/controller/image/digest"),
    ({"rollout": {"gpuResourceName": "nvidia gpu"}}, "/rollout/gpuResourceName"),
    ({"priorityClassName": "High_Priority"}, "/priorityClassName"),
    ({"reward": {"extraVolumeMounts": [{"name": "x", "mountPath": "relative"}]}}, "/reward/extraVolumeMounts/0/mountPath"),
    ({"rollout": {"updateStrategy": {"type": "BlueGreen"}}}, "/rollout/updateStrategy/type"),
    ({"learner": {"terminationGracePeriodSeconds": -1}}, "/learner/terminationGracePeriodSeconds"),
    ({"metrics": {"alerts": {"clipRatioRunaway": {"threshold": 2, "for": "15m"}}}}, "/metrics/alerts/clipRatioRunaway/threshold"),
]


@pytest.mark.parametrize("values,where", INVALID, ids=[w for _, w in INVALID])
def test_schema_rejects_invalid_production_values(chart, values, where):
    import helm_python as helm

    with pytest.raises(helm.HelmError) as exc:
        chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
    assert "schema" in str(exc.value) and where in str(exc.value), str(exc.value)


# -- Prometheus Operator objects -----------------------------------------------------------------------


def operator_valid(doc: dict) -> None:
    """Validate against the Prometheus Operator's CRD models (cloudcoil's, generated from the CRDs):
    a field the CRD does not know is dropped by the model, so the round trip must give `doc` back."""
    from cloudcoil.models.prometheus_operator import v1

    model = getattr(v1, doc["kind"]).model_validate(doc)
    assert model.model_dump(by_alias=True, exclude_unset=True, mode="json") == doc, f"{doc['kind']} has fields its CRD does not define"


MONITORED = {"metrics": {"serviceMonitor": {"enabled": True}, "alerts": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}}}


@pytest.mark.parametrize("name", VALUE_SETS)
def test_service_monitor_and_prometheus_rule_match_the_operator_crds(chart, name):
    values = {**value_set(name), "metrics": {**value_set(name).get("metrics", {}), **MONITORED["metrics"]}}
    docs = render(chart, values)
    (monitor,), (rule,) = objects(docs, "ServiceMonitor"), objects(docs, "PrometheusRule")
    operator_valid(monitor)
    operator_valid(rule)
    for endpoint in monitor["spec"]["endpoints"]:
        assert {"sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"], "targetLabel": "release"} in endpoint["relabelings"]
    # vLLM's series come through the rollout worker's metrics port: no endpoint on vLLM's own
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"metrics"}  # every pod's metrics port, the controller's too
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    from .test_alerts import ALERTS

    assert alerts == ALERTS
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_alerts_are_off_without_the_operator_unless_forced(chart):
    assert not objects(render(chart, {}), "PrometheusRule")
    assert not objects(render(chart, {"metrics": {"alerts": {"enabled": False}}}), "PrometheusRule")
