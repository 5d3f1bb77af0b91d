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
    assert f"{len(ALERTS)} rules found" in done.stdout, done.stdout


ALERTS = {
    "MagicEntropyCollapse", "MagicClipRatioRunaway", "MagicNoStep", "MagicDeadLetters", "MagicRewardTimeouts", "MagicRewardErrors",
    "MagicTargetDown", "MagicLearnerDown", "MagicLiveWorkersBelowExpected", "MagicRedisMemoryHigh", "MagicRedisRefusedWrites",
}
"""Every alert the chart ships; each has a promtool case that fires it (`test_every_alert_has_a_firing_case`)."""


def promtool_cases() -> list[dict]:
    """`promtool test rules` cases (evaluated against the chart's defaults: rollout and reward 2
    replicas, one learner): for each alert, series that fire it and series that must not."""
    learner, controller, reward = {**L, "component": "learner"}, {**L, "component": "controller"}, {**L, "component": "reward"}
    return [
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
        {  # one prompt dead-lettered at minute 3: the consumer's series exists at 0 from its attach
            # (magic.store.streams.ConsumerGroup; tests/unit/store/test_dead_letter_series.py), so the first letter counts
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
        {  # code: 3 of 20 responses a minute cannot be judged (15%, the sandbox is broken); math: 1 of 100 (1%)
            "interval": "1m",
            "input_series": [
                series("magic_reward_verdicts_total", {**reward, "kind": "code", "verdict": "error"}, "0+3x40"),
                series("magic_reward_verdicts_total", {**reward, "kind": "code", "verdict": "correct"}, "0+17x40"),
                series("magic_reward_verdicts_total", {**reward, "kind": "math", "verdict": "error"}, "0+1x40"),
                series("magic_reward_verdicts_total", {**reward, "kind": "math", "verdict": "wrong"}, "0+99x40"),
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "MagicRewardErrors", "exp_alerts": []},
                {"eval_time": "30m", "alertname": "MagicRewardErrors", "exp_alerts": [alert(L, kind="code", severity="warning")]},
            ],
        },
        {  # a reward pod unscrapable from minute 2, and a rollout worker that cannot read its vLLM server from
            # minute 4: each fires after 5 min; the targets that answer, and the other release's dead one, do not
            "interval": "1m",
            "input_series": [
                series("up", {**reward, "job": "rl-magic-reward", "instance": "10.0.0.7:9400"}, "1 1 0x20"),
                series("up", {**controller, "job": "rl-magic-controller", "instance": "10.0.0.2:8080"}, "1x22"),
                series("up", {**OTHER, "component": "learner", "job": "other-magic-learner", "instance": "10.0.1.3:9400"}, "0x22"),
                series("magic_vllm_up", {**L, "component": "rollout", "job": "rl-magic-rollout", "instance": "10.0.0.5:9400"}, "1 1 1 1 0x18"),
                series("magic_vllm_up", {**L, "component": "rollout", "job": "rl-magic-rollout", "instance": "10.0.0.6:9400"}, "1x22"),
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "MagicTargetDown", "exp_alerts": []},
                {"eval_time": "8m", "alertname": "MagicTargetDown", "exp_alerts": [
                    alert(reward, job="rl-magic-reward", instance="10.0.0.7:9400", severity="critical"),
                ]},
                {"eval_time": "10m", "alertname": "MagicTargetDown", "exp_alerts": [
                    alert(reward, job="rl-magic-reward", instance="10.0.0.7:9400", severity="critical"),
                    alert({**L, "component": "vllm"}, job="rl-magic-rollout", instance="10.0.0.5:9400", severity="critical"),
                ]},
            ],
        },
        {  # a normal multi-node start: each learner pod answers only once torchrun's rendezvous and DeepSpeed are
            # up (25 min here, within the 30 min startup budget): no alert at any time; the learner pod that
            # then stops answering fires after 5 min, as any target
            "interval": "1m",
            "input_series": [
                series("up", {**learner, "job": "rl-magic-learner", "instance": "10.0.2.1:9400"}, "0x25 1x10 0x20"),
                series("up", {**learner, "job": "rl-magic-learner", "instance": "10.0.2.2:9400"}, "0x25 1x30"),
            ],
            "alert_rule_test": [
                {"eval_time": t, "alertname": name, "exp_alerts": []}
                for t in ("5m", "10m", "20m", "26m", "30m", "36m") for name in ("MagicTargetDown", "MagicLearnerDown")
            ] + [
                {"eval_time": "43m", "alertname": "MagicTargetDown", "exp_alerts": [
                    alert(learner, job="rl-magic-learner", instance="10.0.2.1:9400", severity="critical"),
                ]},
                {"eval_time": "43m", "alertname": "MagicLearnerDown", "exp_alerts": []},
            ],
        },
        {  # a learner pod that never answers (a node that never joined the rendezvous): MagicLearnerDown once the
            # whole startup budget (30 min) has passed, never MagicTargetDown; another release's never counts
            "interval": "1m",
            "input_series": [
                series("up", {**learner, "job": "rl-magic-learner", "instance": "10.0.2.3:9400"}, "0x45"),
                series("up", {**OTHER, "component": "learner", "job": "other-magic-learner", "instance": "10.0.2.4:9400"}, "0x45"),
            ],
            "alert_rule_test": [
                {"eval_time": "29m", "alertname": "MagicLearnerDown", "exp_alerts": []},
                {"eval_time": "31m", "alertname": "MagicLearnerDown", "exp_alerts": [
                    alert(learner, job="rl-magic-learner", instance="10.0.2.3:9400", severity="critical"),
                ]},
                {"eval_time": "40m", "alertname": "MagicTargetDown", "exp_alerts": []},
            ],
        },
        {  # 1 of the 2 rollout workers the chart deploys is alive for 20 min; the reward workers (2 of 2) and
            # the learner are: only rollout fires, after 10 min
            "interval": "1m",
            "input_series": [
                series("magic_live_workers", {**controller, "service": "rollout"}, "2 2 1x20"),
                series("magic_live_workers", {**controller, "service": "reward"}, "2x22"),
                series("magic_live_workers", {**controller, "service": "learner"}, "1x22"),
                series("magic_live_workers", {**OTHER, "component": "controller", "service": "rollout"}, "0x22"),
            ],
            "alert_rule_test": [
                {"eval_time": "8m", "alertname": "MagicLiveWorkersBelowExpected", "exp_alerts": []},
                {"eval_time": "15m", "alertname": "MagicLiveWorkersBelowExpected", "exp_alerts": [alert(controller, service="rollout", severity="warning")]},
            ],
        },
        {  # Redis at 2.7 of 3 GB (90%) from minute 2: fires after 5 min; a Redis with no maxmemory (0) never does
            "interval": "1m",
            "input_series": [
                series("redis_memory_used_bytes", {**L, "component": "redis", "instance": "10.0.0.9:9121"}, "1e9 1e9 2.7e9x20"),
                series("redis_memory_max_bytes", {**L, "component": "redis", "instance": "10.0.0.9:9121"}, "3e9x22"),
                series("redis_memory_used_bytes", {**L, "component": "redis", "instance": "10.0.0.8:9121"}, "5e9x22"),
                series("redis_memory_max_bytes", {**L, "component": "redis", "instance": "10.0.0.8:9121"}, "0x22"),
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "MagicRedisMemoryHigh", "exp_alerts": []},
                {"eval_time": "10m", "alertname": "MagicRedisMemoryHigh", "exp_alerts": [alert({**L, "component": "redis"}, instance="10.0.0.9:9121", severity="warning")]},
            ],
        },
        {  # a rollout worker's writes refused at minute 3 (its counter starts at 0); processes that refused nothing stay silent
            "interval": "1m",
            "input_series": [
                series("magic_redis_refused_writes_total", {**L, "component": "rollout", "pod": "rollout-a"}, "0 0 0 2x20"),
                series("magic_redis_refused_writes_total", {**L, "component": "reward", "pod": "reward-a"}, "0x23"),
            ],
            "alert_rule_test": [
                {"eval_time": "2m", "alertname": "MagicRedisRefusedWrites", "exp_alerts": []},
                {"eval_time": "5m", "alertname": "MagicRedisRefusedWrites", "exp_alerts": [alert(L, severity="critical")]},
                {"eval_time": "20m", "alertname": "MagicRedisRefusedWrites", "exp_alerts": []},
            ],
        },
    ]


def test_every_alert_has_a_firing_case(chart):
    """No alert ships untested: each rule is fired by at least one promtool case above."""
    shipped = {r["alert"] for g in rule_groups(chart) for r in g["rules"]}
    assert shipped == ALERTS
    fired = {t["alertname"] for case in promtool_cases() for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert fired == shipped, f"alerts with no case that fires them: {shipped - fired}"


def test_every_alert_fires_when_it_should_and_only_then(chart, tmp_path):
    groups = copy.deepcopy(rule_groups(chart))
    for group in groups:  # the annotation texts are checked by `promtool check rules`; here: when each alert fires
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    tests = promtool_cases()
    (tmp_path / "tests.yml").write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}))
    done = subprocess.run([promtool(), "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_thresholds_come_from_values(chart):
    groups = rule_groups(chart, {"entropyCollapse": {"ratio": 0.3, "for": "5m"}, "noStep": {"for": "1h"}})
    rules = {r["alert"]: r for g in groups for r in g["rules"]}
    assert "< 0.3 * magic_entropy_target" in rules["MagicEntropyCollapse"]["expr"] and rules["MagicEntropyCollapse"]["for"] == "5m"
    assert "[1h]" in rules["MagicNoStep"]["expr"]
    import promql_parser

    for rule in rules.values():  # every selector is limited to this release
        found = []
        promql_parser.walk(promql_parser.parse(rule["expr"]), lambda n: found.append(n) if isinstance(n, (promql_parser.VectorSelector, promql_parser.MatrixSelector)) else None)
        selectors = [n if isinstance(n, promql_parser.VectorSelector) else n.vector_selector for n in found]
        assert selectors, rule["alert"]
        for sel in selectors:
            matchers = {m.name: m.value for m in sel.matchers.matchers}
            assert matchers.get("release") == RELEASE and matchers.get("namespace") == NAMESPACE, (rule["alert"], sel.name)


def test_live_workers_are_compared_with_the_deployed_replicas(chart):
    rules = {r["alert"]: r for g in rule_groups_with(chart, {"rollout": {"replicas": 5}, "reward": {"replicas": 0}}) for r in g["rules"]}
    expr = rules["MagicLiveWorkersBelowExpected"]["expr"]
    assert 'service="rollout", namespace="ml", release="rl"} < 5)' in expr and 'service="learner"' in expr
    assert 'service="reward"' not in expr  # none deployed: none expected


def rule_groups_with(chart, values: dict) -> list[dict]:
    (rule,) = objects(render(chart, {**values, "metrics": {"alerts": {"enabled": True}}}), "PrometheusRule")
    return rule["spec"]["groups"]
