"""Shared pieces of the deployment tests: the chart, its value sets, the dashboards and their queries."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "magic"
DASHBOARDS = CHART / "dashboards"

VALUE_SETS = {
    "default": None,
    "cpu": CHART / "ci" / "cpu-values.yaml",
    "gpu-7b": CHART / "ci" / "gpu-7b-values.yaml",
    "gpu-32b": CHART / "ci" / "gpu-32b-values.yaml",
    "external-redis": CHART / "ci" / "external-redis-values.yaml",
    "restricted": CHART / "ci" / "restricted-values.yaml",
}
"""The values the chart is rendered with: its defaults and the example sets in charts/magic/ci/."""

RELEASE, NAMESPACE = "rl", "ml"


def value_set(name: str) -> dict:
    path = VALUE_SETS[name]
    return yaml.safe_load(path.read_text()) if path else {}


@dataclass(frozen=True)
class Query:
    dashboard: str
    panel: str
    ref_id: str
    expr: str

    @property
    def id(self) -> str:
        return f"{self.dashboard}/{self.panel}/{self.ref_id}"

    def resolved(self, rate_interval: str) -> str:
        """The PromQL Grafana sends: the template variables replaced (namespace and release = All)."""
        return self.expr.replace("$__rate_interval", rate_interval).replace("$namespace", ".*").replace("$release", ".*")


def load_dashboards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def dashboard_queries() -> list[Query]:
    out = []
    for name, board in load_dashboards().items():
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                out.append(Query(name, panel["title"], target["refId"], target["expr"]))
    return out


@pytest.fixture(scope="session")
def chart():
    import helm_python as helm

    with helm.Chart.load(CHART) as c:
        yield c
