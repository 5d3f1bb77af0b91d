"""A controller killed with SIGKILL mid-run and started again resumes the step barrier exactly:
the run finishes with every step published once, trained once and recorded once."""

from __future__ import annotations

import json
import time
from collections import Counter

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

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

TOKEN = "restart-test-token-0123456789abcdef"
STEPS = 6
D_R = 2


def test_sigkilled_controller_resumes_without_duplicate_or_skipped_steps(tmp_path, tiny_model_dir):
    data = tmp_path / "train.jsonl"
    task.write_jsonl(data, [task.record(t, "train", i) for i, t in enumerate(task.make_splits(5, 0, 10, 0)["train"])])
    server = RedisServer().start()
    r = redis.Redis.from_url(server.url)
    port = free_port()
    env = {"MAGIC_REDIS_URL": server.url, "MAGIC_DATA_DIR": str(tmp_path / "data"), "MAGIC_TORCH_THREADS": "1"}
    sup = Supervisor(tmp_path / "logs", env)
    controller_env = {"MAGIC_PORT": str(port), "MAGIC_TRIM_STREAMS": "false", "MAGIC_API_TOKEN": TOKEN, "MAGIC_LEASE_SECONDS": "1.5"}
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, headers={"Authorization": f"Bearer {TOKEN}"})
    k = keys.RunKeys("restart")

    def state():
        return {a.decode(): b.decode() for a, b in r.hgetall(k.state).items()}

    try:
        sup.start("controller", "magic.controller", controller_env)
        sup.start("learner", "magic.learner")
        sup.start("rollout-0", "magic.rollout")
        sup.start("reward-0", "magic.reward")
        wait_for(lambda: answers(f"http://127.0.0.1:{port}/readyz"), 60, "the controller", sup, interval=0.02)
        spec = {
            "name": "restart",
            "model": str(tiny_model_dir),
            "datasets": [str(data)],
            "stages": [
                {"name": "a", "steps": STEPS // 2, "T": 8, "D_R": D_R, "gs": 2, "lr": 1e-3},
                {"name": "b", "steps": STEPS // 2, "T": 12, "D_R": D_R, "gs": 2, "lr": 1e-3},
            ],
        }
        resp = api.post("/v1/runs", json=spec)
        assert resp.status_code == 201, resp.text

        # kill it in the middle of different phases: waiting for the learner, and right after a
        # step was recorded (at the publish point of the next step)
        kills = []
        for at_step, phase in ((1, "rollout"), (3, "publish"), (4, "rollout")):
            s = wait_for(lambda: (st := state()) and int(st["step"]) >= at_step and st["phase"] == phase and st, 120, f"step {at_step} {phase}", sup, interval=0.02)
            sup.kill("controller")
            kills.append((int(s["step"]), s["phase"]))
            time.sleep(0.3)  # the rest of the loop goes on meanwhile
            sup.start("controller", "magic.controller", controller_env)
            wait_for(lambda: answers(f"http://127.0.0.1:{port}/readyz"), 60, "the restarted controller", sup, interval=0.02)

        final = wait_for(lambda: (v := api.get("/v1/runs/restart").json())["status"] in ("finished", "failed") and v, 180, "the run to end", sup, interval=0.02)
        assert final["status"] == "finished", final.get("error")
        assert len(kills) == 3

        # every step recorded exactly once, in order, in Redis and in the JSONL log
        records = api.get("/v1/runs/restart/metrics").json()
        assert [x["step"] for x in records] == list(range(STEPS))
        assert [x["stage_name"] for x in records] == ["a"] * 3 + ["b"] * 3
        lines = (tmp_path / "data" / "runs" / "restart" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(x)["step"] for x in lines] == list(range(STEPS))
        # every step published exactly once (D_R groups), trained once (one version per step)
        published = Counter(g.step for _, g in Stream(r, k.prompts).read_after("0", pb.PromptGroup, count=10_000))
        assert published == {step: D_R for step in range(STEPS)}
        versions = [u.version for _, u in Stream(r, k.weights).read_after("0", pb.WeightUpdate)]
        assert versions == list(range(STEPS + 1))
        completed = [e.step_completed.step for _, e in Stream(r, k.events_of("learner")).read_after("0", pb.Event, count=10_000) if e.HasField("step_completed")]
        assert sorted(completed) == list(range(STEPS))
        assert r.xpending(k.events_of("learner"), "controller")["pending"] == 0
        assert [s["start_step"] for s in final["stages"]] == [0, 3] and final["stages"][0]["end_step"] == 3
        assert sum(r.xlen(d) for d in k.dead_streams()) == 0
    finally:
        sup.stop_all()
        server.stop()
