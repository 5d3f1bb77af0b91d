"""Held-out validation in a run driven through the REST API: every 5 steps (and after the last)
the controller sends the validation prompts through the real rollout and reward services; the
recorded series (step records, GET .../validation, /metrics) must equal an independent
recomputation from the scored samples, and the learner never sees a validation group. An eval
posted mid-run by `magic eval --run` (POST .../evals) goes the same way under its own group ids,
and its figures must equal the recomputation from its scored samples too."""

from __future__ import annotations

import collections
import json
import math
import re
import time

import httpx
import pytest
import redis
from waiting import answers, wait_for

from magic.cli import main
from magic.demo import task
from magic.learner.checkpoints import read_trainer_state
from magic.local.redis_server import RedisServer
from magic.local.supervisor import Supervisor
from magic.protocol import keys
from magic.protocol.pb import messages_pb2 as pb
from magic.runtime.ports import free_port
from magic.store.streams import Stream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

TOKEN = "t0ken-for-the-validation-test-0123456789"


def recompute(groups: list[pb.ScoredGroup], k: int) -> dict:
    """avg@n, pass@k (the binomial form of Chen et al.), mean length, truncated share of one
    dataset at one version, written independently of magic.evaluation."""
    n = len(groups[0].scores)
    correct = [sum(s.correctness >= 1.0 for s in g.scores) for g in groups]
    samples = [s for g in groups for s in g.rollout.samples]
    majority = []
    for g in groups:  # the most frequent extracted answer (every right one the same), ties shared; no answer, no vote
        counts = collections.Counter(True if s.correctness >= 1.0 else "".join(s.answer.split()).replace("$", "").rstrip(".") for s in g.scores)
        counts.pop("", None)
        top = [a for a, c in counts.items() if c == max(counts.values())] if counts else []
        majority.append(top.count(True) / len(top) if top else 0.0)
    return {
        "maj_at_n": sum(majority) / len(groups),
        "prompts": len(groups),
        "samples": n,
        "avg_at_n": sum(c / n for c in correct) / len(groups),
        "pass_at_k": sum(1 - math.comb(n - c, k) / math.comb(n, k) for c in correct) / len(groups),
        "response_length_mean": sum(len(s.response_ids) for s in samples) / len(samples),
        "truncated_ratio": sum(s.finish_reason == pb.FINISH_REASON_LENGTH for s in samples) / len(samples),
    }


def test_validation_every_5_steps_matches_a_recomputation_from_the_scored_samples(tmp_path, tiny_model_dir):
    splits = task.make_splits(5, 0, 12, 6)
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    task.write_jsonl(train, [task.record(t, "train", i) for i, t in enumerate(splits["train"])])
    task.write_jsonl(held, [task.record(t, "eval", i) for i, t in enumerate(splits["eval"])])
    server = RedisServer().start()
    r = redis.Redis.from_url(server.url)
    port = free_port()
    sup = Supervisor(tmp_path / "logs", {"MAGIC_REDIS_URL": server.url, "MAGIC_DATA_DIR": str(tmp_path / "data"), "MAGIC_TORCH_THREADS": "1"})
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, headers={"Authorization": f"Bearer {TOKEN}"})
    rk = keys.RunKeys("val")
    try:
        sup.start("controller", "magic.controller", {"MAGIC_PORT": str(port), "MAGIC_TRIM_STREAMS": "false", "MAGIC_API_TOKEN": TOKEN})
        sup.start("learner", "magic.learner")
        sup.start("rollout-0", "magic.rollout")
        sup.start("reward-0", "magic.reward")
        wait_for(lambda: answers(f"http://127.0.0.1:{port}/readyz"), 60, "the controller to start", sup)
        assert api.post("/v1/datasets", json={"name": "held", "path": str(held)}).status_code == 201
        spec = {
            "name": "val",
            "model": str(tiny_model_dir),
            "datasets": [str(train)],
            "stages": [{"name": "a", "steps": 4, "T": 8, "D_R": 2, "gs": 2}, {"name": "b", "steps": 3, "T": 10, "D_R": 2, "gs": 2}],
            "validation": {"datasets": ["held"], "every": 5, "samples": 3, "pass_k": 2, "max_prompts": 5, "best_by": "avg_at_n"},
        }
        resp = api.post("/v1/runs", json=spec)
        assert resp.status_code == 201, resp.text
        # mid-run (step 2 recorded), the CLI posts an eval of the current policy and waits for it
        wait_for(lambda: len(api.get("/v1/runs/val/metrics").json()) >= 2, 120, "step 1 to be recorded", sup, interval=0.2)
        out = tmp_path / "eval.json"
        argv = ["eval", "--run", "val", "-d", "held", "-n", "2", "--pass-k", "1", "--max-prompts", "4", "--T", "48", "--wait", "--interval", "0.2", "--out", str(out)]
        assert main([*argv, "--url", f"http://127.0.0.1:{port}", "--token", TOKEN]) == 0
        evaluated = json.loads(out.read_text())
        deadline = time.monotonic() + 240
        while (view := api.get("/v1/runs/val").json())["status"] not in ("finished", "failed"):
            assert time.monotonic() < deadline and sup.first_exit() is None, view
            time.sleep(0.2)
        assert view["status"] == "finished", view.get("error")

        # what the reward service scored for validation, by version; none of it reached the learner
        validated: dict[int, list[pb.ScoredGroup]] = {}
        asked: list[pb.ScoredGroup] = []
        for _, g in Stream(r, rk.estimates).read_after("0", pb.ScoredGroup):
            assert g.rollout.prompt.kind == pb.GROUP_KIND_VALIDATE and all(s.policy_version == g.rollout.prompt.policy_version for s in g.rollout.samples)
            if g.rollout.prompt.group_id.startswith("eval:"):
                asked.append(g)
            else:
                validated.setdefault(g.rollout.prompt.policy_version, []).append(g)
        # the eval: its own group ids, one policy version at a step boundary after step 1, T and k as asked
        assert sorted(g.rollout.prompt.group_id for g in asked) == [f"eval:1:held:{i:05d}" for i in range(4)]
        versions = {g.rollout.prompt.policy_version for g in asked}
        assert len(versions) == 1 and 2 <= versions.pop() == evaluated["policy_version"] <= 7
        assert all(g.rollout.prompt.sampling.max_tokens == 48 and len(g.scores) == 2 for g in asked)
        assert evaluated["status"] == "done" and evaluated["context_length"] == 48 and evaluated["id"] == "1"
        assert api.get("/v1/runs/val/evals/1").json()["figures"] == evaluated["figures"]
        want = recompute(asked, k=1)
        got = evaluated["figures"]["held"]
        assert got["k"] == 1
        for key, value in want.items():
            assert got[key] == pytest.approx(value), key
        assert sorted(validated) == [0, 5, 7]  # every 5 steps from the initial model, and the final policy
        assert all(len(gs) == 5 and {g.rollout.prompt.prompt_uid for g in gs} == {f"held:{i}" for i in range(1, 6)} for gs in validated.values())
        # T is the stage's: a (8) at version 0, b (10) at 5 and 7
        assert {v: {g.rollout.prompt.sampling.max_tokens for g in gs} for v, gs in validated.items()} == {0: {8}, 5: {10}, 7: {10}}
        scored = [g for _, g in Stream(r, rk.scored).read_after("0", pb.ScoredGroup)]
        assert len(scored) == 14 and all(g.rollout.prompt.kind == pb.GROUP_KIND_TRAIN for g in scored)

        expected = {v: recompute(gs, k=2) for v, gs in validated.items()}
        stored = api.get("/v1/runs/val/validation").json()
        assert sorted(stored) == ["0", "5", "7"]
        for v, want in expected.items():
            got = stored[str(v)]["held"]
            assert got["k"] == 2 and got["pass_at_k_ci_low"] <= got["pass_at_k"] <= got["pass_at_k_ci_high"]
            # the record names its sampling: T (the stage's at that version), tau, top-p, the version
            assert (got["T"], got["policy_version"], got["top_p"]) == ({0: 8, 5: 10, 7: 10}[v], v, 1.0) and got["temperature"] > 0
            for key, value in want.items():
                assert got[key] == pytest.approx(value), (v, key)
        # the step records of steps 0 and 5 carry them (metrics.jsonl alike); the others do not
        records = api.get("/v1/runs/val/metrics").json()
        assert [r["step"] for r in records if "validation" in r] == [0, 5]
        assert records[5]["validation"] == stored["5"]
        jsonl = (tmp_path / "data" / "runs" / "val" / "metrics.jsonl").read_text().splitlines()
        assert len(jsonl) == 8 and '"validation"' in jsonl[5]
        assert json.loads(jsonl[7]) == {"step": 7, "policy_version": 7, "final": True, "validation": stored["7"]}  # the final policy's, last
        # checkpoints: stage a's end (after 4 steps), each new best (by avg@n), the plan's end; the best kept
        values = {v: stored[str(v)]["held"]["avg_at_n"] for v in (0, 5, 7)}
        best = max(values, key=lambda v: (values[v], -v))  # the first of equals
        assert view["best"] == {"policy_version": best, "by": "avg_at_n", "value": values[best], "checkpoint": f"step-{best:08d}" if best else None,
                                "checkpoint_written": best > 0}
        ckpts = sorted((tmp_path / "data" / "runs" / "val" / "checkpoints").glob("step-*/COMPLETE"))
        names = [c.parent.name for c in ckpts]
        assert "step-00000007" in names and (best == 0 or f"step-{best:08d}" in names) and set(names) <= {"step-00000004", "step-00000005", "step-00000007"}
        # v4, then v5 if it beat v0, then v7: keep_checkpoints = 2 leaves v5 and v7, or v4 and v7 (the best among them)
        assert names == (["step-00000005", "step-00000007"] if values[5] > values[0] else ["step-00000004", "step-00000007"])
        assert all(read_trainer_state(c.parent)["policy_version"] == int(c.parent.name[5:]) for c in ckpts)
        # the status shows the latest (final) validation, /metrics its series
        assert view["validation"] == {"policy_version": 7, "datasets": stored["7"]}
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        series = dict(re.findall(r'^(magic_validation_\w+\{[^}]*\}) (\S+)$', text, re.M))
        assert float(series['magic_validation_avg_at_n{dataset="held"}']) == pytest.approx(expected[7]["avg_at_n"])
        assert float(series['magic_validation_pass_at_k{dataset="held"}']) == pytest.approx(expected[7]["pass_at_k"])
        assert float(series['magic_validation_response_length_tokens{dataset="held"}']) == pytest.approx(expected[7]["response_length_mean"])
        assert float(series['magic_validation_truncated_ratio{dataset="held"}']) == pytest.approx(expected[7]["truncated_ratio"])
        assert float(series['magic_validation_policy_version{dataset="held"}']) == 7
        cost = [records[s]["validation"]["held"]["seconds"] / records[s]["step_seconds_total"] for s in (0, 5)]
        print(f"validation cost: {cost} of a step's wall time (5 prompts x 3 samples vs 2 x 2 trained)")
    finally:
        sup.stop_all()
        server.stop()
