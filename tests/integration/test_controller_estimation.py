"""Offline difficulty estimation through the real rollout and reward services: N samples per
prompt with policy version 0, pass rates stored per prompt, 0/N and N/N prompts dropped, and the
learner never sees an estimation group."""

from __future__ import annotations

import time

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


def test_difficulty_estimation_drops_unsolvable_prompts_and_never_reaches_the_learner(tmp_path, tiny_model_dir):
    # the untrained model never writes a boxed sum: every estimated prompt is solved 0/N
    data = tmp_path / "train.jsonl"
    task.write_jsonl(data, [task.record(t, "train", i) for i, t in enumerate(task.make_splits(11, 0, 6, 0)["train"])])
    server = RedisServer().start()
    r = redis.Redis.from_url(server.url)
    port = free_port()
    sup = Supervisor(tmp_path / "logs", {"MAGIC_REDIS_URL": server.url, "MAGIC_DATA_DIR": str(tmp_path / "data"), "MAGIC_TORCH_THREADS": "1"})
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    k = keys.RunKeys("est")
    try:
        sup.start("controller", "magic.controller", {"MAGIC_PORT": str(port), "MAGIC_TRIM_STREAMS": "false"})
        sup.start("learner", "magic.learner")
        sup.start("rollout-0", "magic.rollout")
        sup.start("reward-0", "magic.reward")
        wait_for(lambda: answers(f"http://127.0.0.1:{port}/readyz"), 60, "the controller to start", sup)
        spec = {
            "name": "est",
            "model": str(tiny_model_dir),
            "datasets": [str(data)],
            # estimate 4 of the 6 prompts, 3 groups at a time, N = 4 for the demo's data source
            # (6 for any other); train one step on what is left, with the stage's own penalties
            "estimation": {"N": 6, "samples_by_source": {"*code*": 8, "magic/*": 4}, "T": 6, "tau": 1.0, "max_prompts": 4, "groups_per_batch": 3},
            "stages": [{"name": "s", "steps": 1, "T": 8, "D_R": 2, "gs": 2, "penalties": {"repetition_max": 0.5, "repetition_flat": True, "repetition_ngram": 1}}],
        }
        assert api.post("/v1/runs", json=spec).status_code == 201
        deadline = time.monotonic() + 120
        while (view := api.get("/v1/runs/est").json())["status"] not in ("finished", "failed"):
            assert time.monotonic() < deadline and sup.first_exit() is None, view
            time.sleep(0.2)
        assert view["status"] == "finished", view.get("error")

        body = api.get("/v1/runs/est/pass-rates").json()
        assert body["pass_rates"] == {f"train:{i}": "0/4" for i in range(1, 5)}
        assert set(body["dropped"]) == set(body["pass_rates"]) and all(d == {"from_stage": 0, "reason": "estimated_0"} for d in body["dropped"].values())
        f = view["filtering"]
        assert f["dropped_estimated_0"] == 4 and f["dropped_estimated_all"] == 0
        assert f["estimation"]["status"] == "done" and f["estimation"]["published"] == "4" and f["estimation"]["received"] == "4"
        assert view["stages"][0]["prompts"] == 2

        # estimation groups went to the controller's stream, never to the learner's
        estimated = [g for _, g in Stream(r, k.estimates).read_after("0", pb.ScoredGroup)]
        assert len(estimated) == 4 and all(len(g.scores) == 4 and g.rollout.prompt.kind == pb.GROUP_KIND_ESTIMATE for g in estimated)
        scored = [g for _, g in Stream(r, k.scored).read_after("0", pb.ScoredGroup)]
        assert len(scored) == 2 and all(g.rollout.prompt.kind == pb.GROUP_KIND_TRAIN for g in scored)
        assert {g.rollout.prompt.prompt_uid for g in scored} <= {"train:5", "train:6"}  # only what was not dropped
        # the stage's penalties reached the reward service on each training group (never on estimation ones)
        assert all(g.rollout.prompt.penalties_json for g in scored) and not any(g.rollout.prompt.penalties_json for g in estimated)
        for sc in (sc for g in scored for sc in g.scores):
            assert sc.penalties["repetition"] in (0.0, -0.5) and "overlong" not in sc.penalties
            assert sc.reward == pytest.approx(sc.correctness + sc.penalties["repetition"])
        assert [x["step"] for x in api.get("/v1/runs/est/metrics").json()] == [0]
    finally:
        sup.stop_all()
        server.stop()
