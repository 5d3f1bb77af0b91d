"""The four services as separate OS processes over a real Redis, driven through the REST API."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
import redis
from waiting import answers, wait_for

from magic.demo import task
from magic.local.redis_server import RedisServer
from magic.local.supervisor import Supervisor
from magic.protocol import keys
from magic.protocol.pb import messages_pb2 as pb
from magic.runtime.ports import free_port
from magic.store.streams import Stream

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster(tmp_path):
    server = RedisServer().start()
    port = free_port()
    sup = Supervisor(tmp_path / "logs", {"MAGIC_REDIS_URL": server.url, "MAGIC_DATA_DIR": str(tmp_path / "data"), "MAGIC_TORCH_THREADS": "1"})
    sup.start("controller", "magic.controller", {"MAGIC_PORT": str(port)})
    sup.start("learner", "magic.learner")
    sup.start("rollout-0", "magic.rollout")
    sup.start("reward-0", "magic.reward")
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    wait_for(lambda: answers(f"http://127.0.0.1:{port}/readyz"), 60, "the controller", sup)
    yield api, sup, server, tmp_path
    sup.stop_all()
    server.stop()


def test_a_two_stage_run_trains_through_separate_processes(cluster, tiny_model_dir):
    api, sup, server, tmp = cluster
    data = tmp / "train.jsonl"
    task.write_jsonl(data, [task.record(t, "train", i) for i, t in enumerate(task.make_splits(3, 0, 40, 0)["train"])])
    spec = {
        "name": "e2e",
        "model": str(tiny_model_dir),
        "train_files": [str(data)],
        "stages": [
            {"name": "short", "steps": 2, "T": 12, "D_R": 4, "gs": 4, "lr": 1e-3},
            # N_SGD = 2, mini-batches by prompt slot: the learner streams the no-grad pass and the first mini-batch
            {"name": "long", "steps": 2, "T": 24, "D_R": 4, "gs": 4, "lr": 1e-3, "D_T": 2, "minibatch_rule": "slot"},
        ],
    }
    resp = api.post("/v1/runs", json=spec)
    assert resp.status_code == 201, resp.text
    status = wait_for(lambda: (s := api.get("/v1/runs/e2e").json())["status"] in ("finished", "failed") and s, 240, "the run", sup)
    assert status["status"] == "finished", status.get("error")

    records = api.get("/v1/runs/e2e/metrics").json()
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert [r["context_length"] for r in records] == [12, 12, 24, 24]
    assert [r["stage_name"] for r in records] == ["short", "short", "long", "long"]
    assert all(r["version_mismatch"] == 0 and r["samples"] == 16 for r in records)
    assert all(r["rollout_logprob_diff_max"] < 1e-4 for r in records if r["tokens_trained"] > 0)
    # the untrained model rarely stops within 12 tokens: truncation is visible in stage 1
    assert records[0]["response_clip_ratio"] > 0
    for phase in ("rollout", "train", "weight_sync"):
        assert all(r[f"step_seconds_{phase}"] >= 0 for r in records)
    assert all(r["streamed"] == 1.0 for r in records)  # MAGIC_STREAM's default, N_SGD = 2 included
    assert [r["n_sgd"] for r in records] == [1, 1, 2, 2]
    assert all(r["sgd_steps"] <= r["n_sgd"] and (r["sgd_steps"] > 0) == (r["groups_trained"] > 0) for r in records)

    # every step was trained once, on samples of its own version (version_mismatch above); what the
    # completed steps left in Redis was trimmed: no prompt, rollout or old weight announcement remains
    r = redis.Redis.from_url(server.url)
    k = keys.RunKeys("e2e")
    versions = [u.version for _, u in Stream(r, k.weights).read_after("0", pb.WeightUpdate)]
    assert versions == [4]
    assert r.xlen(k.prompts) == 0 and r.xlen(k.rollouts) == 0
    assert sum(r.xlen(d) for d in k.dead_streams()) == 0
    assert int(r.hget(k.weight_versions, "rollout-0")) == 4

    # the JSONL log holds the same records
    lines = (tmp / "data" / "runs" / "e2e" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 1, 2, 3]
    # the controller and the learner export the figures on /metrics
    text = api.get("/metrics").text
    assert 'magic_step_seconds{phase="train"}' in text and "magic_context_length 24.0" in text


def test_bounded_staleness_overlaps_the_steps_of_a_stage_and_drains_at_its_end(cluster, tiny_model_dir):
    """max_staleness s = 1: step k + 1 is published while step k is out, its samples may come from
    version k and are trained (decoupled objective), each step once; the first step of the next
    stage and a step whose version is validated are never published ahead (no sample of stage j
    trains in stage j + 1; a validation sees every worker on its version)."""
    api, sup, server, tmp = cluster
    data, held = tmp / "train.jsonl", tmp / "held.jsonl"
    splits = task.make_splits(3, 0, 40, 4)
    task.write_jsonl(data, [task.record(t, "train", i) for i, t in enumerate(splits["train"])])
    task.write_jsonl(held, [task.record(t, "eval", i) for i, t in enumerate(splits["eval"])])
    assert api.post("/v1/datasets", json={"name": "held", "path": str(held)}).status_code == 201
    stage = {"T": 12, "D_R": 4, "gs": 4, "lr": 1e-3, "max_staleness": 1}
    spec = {"name": "stale", "model": str(tiny_model_dir), "train_files": [str(data)],
            "stages": [{"name": "one", "steps": 3, **stage}, {"name": "two", "steps": 4, **stage}],
            "validation": {"datasets": ["held"], "every": 4, "samples": 2}}
    resp = api.post("/v1/runs", json=spec)
    assert resp.status_code == 201, resp.text
    status = wait_for(lambda: (s := api.get("/v1/runs/stale").json())["status"] in ("finished", "failed") and s, 240, "the run", sup)
    assert status["status"] == "finished", status.get("error")
    records = api.get("/v1/runs/stale/metrics").json()
    assert [r["step"] for r in records] == list(range(7))
    assert all(r["version_mismatch"] == 0 and r["samples"] == 16 and r["samples_fresh"] + r["samples_stale"] == 16 for r in records)
    # the plan's first step, the first of stage "two" (3) and the validated one (4): drained, every sample of the step's own version
    assert [records[i]["samples_stale"] for i in (0, 3, 4)] == [0, 0, 0] and "validation" in records[4]
    assert sum(r["samples_stale"] for r in records) > 0, "no step trained a sample of the previous version: nothing overlapped"
    assert all(r["version_lag_max"] <= 1 for r in records)
    log = (tmp / "logs" / "controller.log").read_text()
    ahead = sorted(int(line.split("step ")[1].split(" ")[0]) for line in log.splitlines() if "prompt groups ahead" in line)
    assert ahead and set(ahead) <= {1, 2, 5, 6}, ahead  # never step 0, the first step of stage "two" nor a validated step
    r = redis.Redis.from_url(server.url)
    k = keys.RunKeys("stale")
    assert [u.version for _, u in Stream(r, k.weights).read_after("0", pb.WeightUpdate)] == [7]
    assert sum(r.xlen(d) for d in k.dead_streams()) == 0


def test_poison_prompt_is_dead_lettered_and_the_run_goes_on(cluster, tiny_model_dir):
    api, sup, server, tmp = cluster
    data = tmp / "train.jsonl"
    task.write_jsonl(data, [task.record(t, "train", i) for i, t in enumerate(task.make_splits(4, 0, 10, 0)["train"])])
    r = redis.Redis.from_url(server.url)
    poison = {b"type": b"PromptGroup", b"pb": b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"}
    spec = {"name": "poison", "model": str(tiny_model_dir), "train_files": [str(data)], "stages": [{"steps": 2, "T": 8, "D_R": 2, "gs": 2}]}
    r.xadd(keys.RunKeys("poison").prompts, poison)  # before the run exists: its key is squatted, the run refused
    refused = api.post("/v1/runs", json=spec)
    assert refused.status_code == 409 and "magic:{poison}:prompts (a stream)" in refused.json()["detail"], refused.text
    r.delete(keys.RunKeys("poison").prompts)
    assert api.post("/v1/runs", json=spec).status_code == 201
    r.xadd(keys.RunKeys("poison").prompts, poison)
    status = wait_for(lambda: (s := api.get("/v1/runs/poison").json())["status"] in ("finished", "failed") and s, 120, "the run", sup)
    assert status["status"] == "finished", status.get("error")
    dead = r.xrange(keys.RunKeys("poison").dead_of("rollout"))
    assert len(dead) == 1


@pytest.mark.parametrize("failing_env", [{"MAGIC_MAX_BATCH_SEQUENCES": "0"}])
def test_launcher_stops_everything_when_a_service_dies(tmp_path, failing_env):
    """`magic local` must exit non-zero with the dead service's error, not hang."""
    env = {**__import__("os").environ, **failing_env}
    proc = subprocess.run(
        [sys.executable, "-m", "magic.cli", "local", "--out", str(tmp_path / "out"), "--demo-dir", str(tmp_path / "demo"),
         "--sft-steps", "2", "--stage1-steps", "1", "--stage2-steps", "1", "--no-eval", "--timeout", "120"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0
    assert "rollout-0 exited" in proc.stderr and "max_batch_sequences" in proc.stderr
