"""The Grafana dashboards: their model (fixed uids, datasource variable), valid PromQL, the panels the
issue asks for, and every metric and label they query exported by the services."""

from __future__ import annotations

import pytest

from .conftest import dashboard_queries, load_dashboards

pytestmark = pytest.mark.deploy

QUERIES = dashboard_queries()

TARGET_LABELS = {"component", "release", "namespace", "job", "instance", "pod", "service", "endpoint", "container"}
"""Labels Prometheus attaches at scrape time (the ServiceMonitor sets `component` and `release`)."""

VLLM_SERIES = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
    "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
}
"""vLLM's own series (V1 engine, the pinned vLLM's /metrics on the rollout pods' vllm port) the
System dashboard queries; not exported by MAGIC, so not checked against its registry."""

REDIS_EXPORTER_SERIES = {
    "redis_memory_used_bytes": set(), "redis_memory_max_bytes": set(), "redis_connected_clients": set(),
    "redis_commands_processed_total": set(), "redis_errors_total": {"err"},
}
"""oliver006/redis_exporter's series (the pinned v1.88.0, sidecar of the bundled Redis) the System
dashboard queries, with their own labels: INFO's used_memory, maxmemory, connected_clients,
total_commands_processed (exporter/exporter.go's metric map) and errorstat_<ERR> as
errors_total{err} (exporter/info.go). Checked here against that list, not MAGIC's registry."""


def selectors(expr: str):
    """(metric name, {label: (op, value)}) of every vector selector in a PromQL expression."""
    import promql_parser

    found = []

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            found.append((node.name, {m.name: (str(m.op), m.value) for m in node.matchers.matchers}))

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """Every series name the services expose -> the label names it carries, read from the real
    prometheus_client registry after importing each service's modules."""
    import importlib

    from prometheus_client import REGISTRY

    for module in ("magic.controller.app", "magic.rollout.worker", "magic.reward.worker", "magic.learner.worker"):
        importlib.import_module(module)
    # _names_to_collectors maps every exposed sample name (`_total`, `_bucket`, ...) to its
    # collector; a labelled metric with no child yet has no samples, so collect() cannot tell.
    out = {}
    for name, collector in REGISTRY._names_to_collectors.items():
        labels = set(getattr(collector, "_labelnames", ()))
        if name.endswith("_bucket"):
            labels.add("le")
        out[name] = labels
    return out


def test_dashboards_have_fixed_uids_titles_and_a_datasource_variable():
    boards = load_dashboards()
    assert {b["uid"]: b["title"] for b in boards.values()} == {"magic-training": "MAGIC / Training", "magic-system": "MAGIC / System"}
    for board in boards.values():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        assert variables["namespace"]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))
        for panel in board["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"] and all(t["datasource"] == panel["datasource"] for t in panel["targets"]), panel["title"]
            assert panel["description"], panel["title"]
            g = panel["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24


@pytest.mark.parametrize("query", QUERIES, ids=[q.id for q in QUERIES])
def test_query_is_valid_promql(query):
    assert selectors(query.resolved("1m")), "a query must select at least one series"


@pytest.mark.parametrize("query", QUERIES, ids=[q.id for q in QUERIES])
def test_every_queried_metric_and_label_is_exported(query, exported):
    for name, matchers in selectors(query.resolved("1m")):
        if name.startswith("vllm:"):
            assert name in VLLM_SERIES, f"{query.id}: {name} is not one of vLLM's series"
            assert matchers.get("component") == ("MatchOp.Equal", "rollout"), query.id
            continue
        if name.startswith("redis_"):
            assert name in REDIS_EXPORTER_SERIES, f"{query.id}: {name} is not one of redis_exporter's series"
            assert matchers.get("component") == ("MatchOp.Equal", "redis"), query.id
            unknown = set(matchers) - REDIS_EXPORTER_SERIES[name] - TARGET_LABELS
            assert not unknown, f"{query.id}: {name} has no label(s) {unknown}"
            continue
        assert name in exported, f"{name} is queried by {query.id} but no service exports it"
        unknown = set(matchers) - exported[name] - TARGET_LABELS
        assert not unknown, f"{query.id}: {name} has no label(s) {unknown} (it has {sorted(exported[name])})"


def queried(board: str) -> set[str]:
    return {name for q in QUERIES if q.dashboard == board for name, _ in selectors(q.resolved("1m"))}


def test_training_dashboard_covers_the_recipe():
    expected = {
        "magic_policy_entropy", "magic_entropy_target", "magic_entropy_coef", "magic_entropy_bonus_active",  # entropy vs target, coef, gate
        "magic_response_clip_ratio", "magic_pg_clipfrac", "magic_accuracy", "magic_reward_mean",
        "magic_response_length_tokens", "magic_kl", "magic_stage", "magic_context_length", "magic_step_seconds",
        "magic_policy_version", "magic_zero_adv_group_ratio",
        "magic_validation_avg_at_n", "magic_validation_maj_at_n", "magic_validation_pass_at_k", "magic_validation_pass_at_k_ci",  # held-out accuracy per dataset
        "magic_validation_response_length_tokens", "magic_validation_truncated_ratio", "magic_validation_policy_version",
    }
    assert expected <= queried("training"), expected - queried("training")
    exprs = " ".join(q.expr for q in QUERIES if q.dashboard == "training")
    assert 'subset' in exprs and "side" in exprs and "phase" in exprs


def test_system_dashboard_covers_the_services():
    expected = {
        "magic_stream_length", "magic_stream_pending", "magic_stream_lag", "magic_live_workers",
        "magic_rollout_tokens_total", "magic_reward_latency_seconds_bucket", "magic_reward_verdicts_total",
        "magic_weight_load_seconds_bucket", "magic_step_seconds", "magic_errors_total",
    }
    assert expected <= queried("system"), expected - queried("system")
    sandbox = [q for q in QUERIES if q.panel == "Sandbox outcomes"]
    assert sandbox and all('kind="code"' in q.expr for q in sandbox)


def test_every_query_selects_one_release_and_namespace():
    """Two releases in one namespace never merge: every selector filters on $release and $namespace."""
    for board in load_dashboards().values():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["release"]["type"] == "query" and "release)" in variables["release"]["query"]["query"]
    for query in QUERIES:
        for name, matchers in selectors(query.expr.replace("$__rate_interval", "1m")):
            assert matchers.get("release") == ("MatchOp.Re", "$release"), f"{query.id}: {name} is not limited to $release"
            assert matchers.get("namespace") == ("MatchOp.Re", "$namespace"), f"{query.id}: {name} is not limited to $namespace"


def panels():
    for name, board in load_dashboards().items():
        for panel in board["panels"]:
            if panel["type"] != "row":
                yield name, panel


def test_every_panel_has_a_real_unit():
    """'short' (a bare number) is no unit: entropy is in nats, lengths in tokens, rates per second."""
    for name, panel in panels():
        unit = panel["fieldConfig"]["defaults"].get("unit")
        assert unit and unit != "short", f"{name}/{panel['title']}: unit {unit!r}"
        text = (panel["title"] + " " + " ".join(t["expr"] for t in panel["targets"])).lower()
        if "entropy" in panel["title"].lower() and "coefficient" not in panel["title"].lower():
            assert unit == "suffix: nats", panel["title"]
        if ("response length" in panel["title"].lower() or "context length" in panel["title"].lower() and "stage" not in panel["title"].lower()) or "tokens / s" in panel["title"]:
            assert "tokens" in unit, (panel["title"], unit)
        if "rate(" in text and "histogram_quantile" not in text and "vllm" not in text:
            assert unit.endswith("/s"), (panel["title"], unit)


def thresholds_of(board: str, title: str) -> list[float]:
    (panel,) = [p for n, p in panels() if n == board and p["title"] == title]
    return [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"] if s["value"] is not None]


def test_thresholds_mark_what_the_alerts_watch():
    import yaml

    from .conftest import CHART

    alerts = yaml.safe_load((CHART / "values.yaml").read_text())["metrics"]["alerts"]
    assert thresholds_of("training", "Truncated responses (clip ratio)") == [alerts["clipRatioRunaway"]["threshold"]]
    assert thresholds_of("training", "Truncated") == [alerts["clipRatioRunaway"]["threshold"]]
    assert thresholds_of("system", "Dead letters") == [1]
    for board, title in [("training", "PPO clip fraction"), ("training", "Zero-advantage groups"), ("system", "Reward latency"), ("system", "vLLM KV cache usage")]:
        assert thresholds_of(board, title), title
    styled = [p["title"] for _, p in panels() if p["type"] == "timeseries" and p["fieldConfig"]["defaults"].get("thresholds")]
    for _, panel in panels():
        if panel["title"] in styled:
            assert panel["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] != "off", panel["title"]


def test_step_indexed_views_plot_against_the_learner_step():
    board = load_dashboards()["training"]
    xy = [p for p in board["panels"] if p["type"] == "xychart"]
    assert {p["title"] for p in xy} == {"Entropy by step", "Accuracy and truncation by step", "Held-out accuracy by step"}
    for panel in xy:
        x = next(t for t in panel["targets"] if t["legendFormat"] == panel["options"]["dims"]["x"])
        # held-out figures are of the policy version validated (= the step whose record carries them)
        step = "magic_validation_policy_version" if panel["title"].startswith("Held-out") else "magic_learner_step"
        assert [name for name, _ in selectors(x["expr"].replace("$release", ".*").replace("$namespace", ".*"))] == [step]
        assert panel["transformations"] == [{"id": "joinByField", "options": {"byField": "Time", "mode": "outer"}}]


def test_redis_row_shows_memory_against_maxmemory_and_refused_writes():
    names = {name for q in QUERIES if q.dashboard == "system" and q.panel.startswith("Redis") for name, _ in selectors(q.resolved("1m"))}
    assert {"redis_memory_used_bytes", "redis_memory_max_bytes", "magic_redis_refused_writes_total", "redis_errors_total"} <= names
    titles = [p["title"] for _, p in panels()]
    assert titles.index("Redis memory") > titles.index("vLLM KV cache usage")
    rows = [p for p in load_dashboards()["system"]["panels"] if p["type"] == "row"]
    assert rows[-1]["title"] == "Redis"


def test_vllm_engine_panels():
    names = {name for q in QUERIES if q.dashboard == "system" for name, _ in selectors(q.resolved("1m"))}
    assert {"vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:generation_tokens_total"} <= names
