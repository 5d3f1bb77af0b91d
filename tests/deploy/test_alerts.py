"""The alert rules the chart ships (PrometheusRule, templates/_alerts.tpl), checked with Prometheus'
own tools: `promtool check rules` on the rendered groups, and `promtool test rules` with series
that must fire each alert, and series that must not (another release, a finished run, a healthy
figure). tests/deploy/test_prometheus.py has the real Prometheus evaluate them over a real run."""

from __future__ import annotations

import copy
import shutil
import subprocess

import pytest
import yaml

from .conftest import NAMESPACE, RELEASE
from .test_chart import objects, render

pytestmark = pytest.mark.deploy

L = {"namespace": NAMESPACE, "release": RELEASE}
OTHER = {"namespace": NAMESPACE, "release": "other"}


def rule_groups(chart, values: dict | None = None) -> list[dict]:
    merged = {"metrics": {"alerts": {"enabled": True, **(values or {})}}}
    (rule,) = objects(render(chart, merged), "PrometheusRule")
    return rule["spec"]["groups"]


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool (Debian's prometheus package) is not installed: `make test` installs it"
    return path


def series(name: str, labels: dict, values: str) -> dict:
    body = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def alert(labels: dict, **extra) -> dict:
    return {"exp_labels": {**labels, **extra}}


def test_rules_pass_promtool_check(chart, tmp_path):
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": rule_groups(chart)}))
    done = subprocess.run([promtool(), "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 rules found" in done.stdout, done.stdout


def test_every_alert_fires_when_it_should_and_only_then(chart, tmp_path):
    groups = copy.deepcopy(rule_groups(chart))
    for group in groups:  # the annotation texts are checked by `promtool check rules`; here: when each alert fires
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    learner, controller, reward = {**L, "component": "learner"}, {**L, "component": "controller"}, {**L, "component": "reward"}
    tests = [
        {  # entropy at a quarter of its target for 30 min: fires after 15 min; the other release's identical run is not ours
            "interval": "1m",
            "input_series": [
                series("magic_policy_entropy", learner, "0.05x30"),
                series("magic_entropy_target", learner, "0.2x30"),
                series("magic_policy_entropy", {**OTHER, "component": "learner"}, "0.05x30"),
                series("magic_entropy_target", {**OTHER, "component": "learner"}, "0.2x30"),
                series("magic_response_clip_ratio", learner, "0.05x30"),
            ],
            "alert_rule_test": [
                {"eval_time": "10m", "alertname": "MagicEntropyCollapse", "exp_alerts": []},
                {"eval_time": "20m", "alertname": "MagicEntropyCollapse", "exp_alerts": [alert(learner, severity="warning")]},
                {"eval_time": "20m", "alertname": "MagicClipRatioRunaway", "exp_alerts": []},
            ],
        },
        {  # entropy at 0.15 against 0.2 (above half of it) and half the responses truncated
            "interval": "1m",
            "input_series": [
                series("magic_policy_entropy", learner, "0.15x30"),
                series("magic_entropy_target", learner, "0.2x30"),
                series("magic_response_clip_ratio", learner, "0.5x30"),
            ],
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": "MagicEntropyCollapse", "exp_alerts": []},
                {"eval_time": "10m", "alertname": "MagicClipRatioRunaway", "exp_alerts": []},
                {"eval_time": "20m", "alertname": "MagicClipRatioRunaway", "exp_alerts": [alert(learner, severity="warning")]},
            ],
        },
        {  # step stuck at 5 while 3 scored entries wait: fires once 30 min have passed without a change
            "interval": "1m",
            "input_series": [
                series("magic_step", controller, "5x50"),
                series("magic_stream_lag", {**controller, "stream": "scored"}, "3x50"),
                series("magic_stream_pending", {**controller, "stream": "scored"}, "0x50"),
                series("magic_stream_lag", {**controller, "stream": "dead"}, "7x50"),
            ],
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": "MagicNoStep", "exp_alerts": []},
                {"eval_time": "40m", "alertname": "MagicNoStep", "exp_alerts": [alert(L, severity="critical")]},
            ],
        },
        {  # a finished run (nothing waiting), and a run that keeps stepping: no alert
            "interval": "1m",
            "input_series": [
                series("magic_step", controller, "5x50"),
                series("magic_stream_lag", {**controller, "stream": "prompts"}, "0x50"),
                series("magic_stream_pending", {**controller, "stream": "prompts"}, "0x50"),
                series("magic_step", {**OTHER, "component": "controller"}, "0+1x50"),
                series("magic_stream_lag", {**OTHER, "component": "controller", "stream": "prompts"}, "4x50"),
                series("magic_stream_pending", {**OTHER, "component": "controller", "stream": "prompts"}, "4x50"),
            ],
            "alert_rule_test": [{"eval_time": "45m", "alertname": "MagicNoStep", "exp_alerts": []}],
        },
        {  # one prompt dead-lettered at minute 3
            "interval": "1m",
            "input_series": [series("magic_dead_letters_total", {**L, "component": "rollout", "stream": "prompts"}, "0 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1")],
            "alert_rule_test": [
                {"eval_time": "2m", "alertname": "MagicDeadLetters", "exp_alerts": []},
                {"eval_time": "5m", "alertname": "MagicDeadLetters", "exp_alerts": [alert(L, stream="prompts", severity="warning")]},
                {"eval_time": "19m", "alertname": "MagicDeadLetters", "exp_alerts": []},
            ],
        },
        {  # code: 5 of 20 responses a minute time out (25%); math: 1 of 100 (1%)
            "interval": "1m",
            "input_series": [
                series("magic_reward_timeouts_total", {**reward, "kind": "code"}, "0+5x40"),
                series("magic_reward_verdicts_total", {**reward, "kind": "code", "verdict": "correct"}, "0+15x40"),
                series("magic_reward_verdicts_total", {**reward, "kind": "code", "verdict": "timeout"}, "0+5x40"),
                series("magic_reward_timeouts_total", {**reward, "kind": "math"}, "0+1x40"),
                series("magic_reward_verdicts_total", {**reward, "kind": "math", "verdict": "correct"}, "0+100x40"),
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "MagicRewardTimeouts", "exp_alerts": []},
                {"eval_time": "30m", "alertname": "MagicRewardTimeouts", "exp_alerts": [alert(L, kind="code", severity="warning")]},
            ],
        },
    ]
    (tmp_path / "tests.yml").write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}))
    done = subprocess.run([promtool(), "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_thresholds_come_from_values(chart):
    groups = rule_groups(chart, {"entropyCollapse": {"ratio": 0.3, "for": "5m"}, "noStep": {"for": "1h"}})
    rules = {r["alert"]: r for g in groups for r in g["rules"]}
    assert "< 0.3 * magic_entropy_target" in rules["MagicEntropyCollapse"]["expr"] and rules["MagicEntropyCollapse"]["for"] == "5m"
    assert "[1h]" in rules["MagicNoStep"]["expr"]
    for rule in rules.values():  # every selector is limited to this release
        assert rule["expr"].count(f'release="{RELEASE}"') == rule["expr"].count("magic_")
