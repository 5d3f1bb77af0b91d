"""The Grafana dashboards: their model (fixed uids, datasource variable), valid PromQL, the panels the
issue asks for, and every metric and label they query exported by the services."""

from __future__ import annotations

import pytest

from .conftest import dashboard_queries, load_dashboards

pytestmark = pytest.mark.deploy

QUERIES = dashboard_queries()

TARGET_LABELS = {"component", "namespace", "job", "instance", "pod", "service", "endpoint", "container"}
"""Labels Prometheus attaches at scrape time (the ServiceMonitor sets `component`)."""


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
