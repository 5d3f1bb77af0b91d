"""Requested evaluations (POST /v1/runs/{run}/evals) over a real Redis: the same path as in-run
validation under their own scope (group ids `eval:<id>:...`), published once and counted once
across a restarted controller, served by the run's driver while it is paused or waits for a
stage, and every bad request refused with its reason (404, 409, 422)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from fastapi.testclient import TestClient
from held_out import held_file, receive, run_job, score

from magic.config.schema import DatasetSpec, RunSpec
from magic.controller.app import create_app
from magic.controller.datasets import DatasetRegistry
from magic.controller.settings import ControllerSettings
from magic.controller.validation import Validation
from magic.demo import task
from magic.protocol import codec, keys
from magic.protocol.pb import messages_pb2 as pb
from magic.store.datasets import DatasetIndex
from magic.store.runs import Runs
from magic.store.streams import Stream

pytestmark = pytest.mark.integration

TOKEN = "t0ken-for-the-eval-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_an_eval_is_published_once_counted_once_and_shares_validations_path(r, tmp_path):
    registry = DatasetRegistry(DatasetIndex(r))
    registry.register(DatasetSpec(name="held", path=str(held_file(tmp_path))))
    spec = RunSpec(name="v", model="m", datasets=["held"], stages=[{"steps": 4, "T": 16, "D_R": 2, "gs": 2}], validation={"datasets": ["held"], "every": 2, "samples": 4, "pass_k": 2})
    runs = Runs(r, tmp_path / "data")
    runs.create(spec)
    rk = keys.RunKeys("v")

    def validation() -> Validation:  # a (re)started controller's
        channels = runs.channels("v", "controller-0", 5)
        return Validation(runs["v"], channels.steps, channels.group("estimates", keys.CONTROLLER_GROUP), registry, ControllerSettings(data_dir=tmp_path / "data", step_timeout_seconds=20))

    record = runs["v"].create_eval({"datasets": ["held"], "samples": 4, "pass_k": 2})
    assert record["id"] == "1" and runs["v"].eval("1")["status"] == "pending"
    v1 = validation()
    # the first controller publishes eval 1's groups on version 2, two are scored, then it "dies"
    with pytest.raises(RuntimeError, match="died"):
        run_job(v1.eval_job(spec, record, 2, 0, 16), lambda: (score(r, "v", stop_after=2), receive(v1), (_ for _ in ()).throw(RuntimeError("died"))))
    running = runs["v"].eval("1")
    assert (running["status"], running["policy_version"], running["context_length"]) == ("running", 2, 16)  # with the groups, in one MULTI
    published, received = runs["v"].evaluation_progress("eval:1")
    assert published == 3 and len(received) == 2
    # a restarted controller at a later version: the eval keeps the version it started on, is not
    # published again, and each group counts once (replays and a forged group included)
    v2 = validation()
    calls: list[int] = []
    done = run_job(v2.eval_job(spec, running, 3, 0, 99), lambda: (calls.append(1), score(r, "v", forged="eval:1:held:00000" if not calls[1:] else None), receive(v2)))
    prompts = [p for _, p in Stream(r, rk.prompts).read_after("0", pb.PromptGroup)]
    assert [p.group_id for p in prompts] == ["eval:1:held:00000", "eval:1:held:00001", "eval:1:held:00002"]
    assert all(p.kind == pb.GROUP_KIND_VALIDATE and p.policy_version == 2 and p.sampling.n == 4 and p.sampling.max_tokens == 16 for p in prompts)
    assert done["status"] == "done" and done["policy_version"] == 2
    f = done["figures"]["held"]
    assert (f["prompts"], f["samples"], f["k"]) == (3, 4, 2)
    assert f["avg_at_n"] == pytest.approx((0.25 + 0 + 1) / 3)
    assert f["pass_at_k"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert f["response_length_mean"] == pytest.approx(4.5) and f["truncated_ratio"] == pytest.approx(0.25)
    assert runs["v"].evaluation_progress("eval:1") == (0, {})  # per-group outcomes dropped once summarised
    dead = [d for _, d in Stream(r, rk.dead_of("controller")).read_after("0", pb.DeadLetter)]
    assert len(dead) == 1 and "differs from the one the controller published" in dead[0].reason
    # an eval never touches the run's validation curve; a validation of the same version runs its
    # own groups with the same seeds (common random numbers) and the same figures come out
    assert runs["v"].validations() == {}
    figures = run_job(v2.job(spec, 2, 0, 16), lambda: (score(r, "v"), receive(v2)))
    val = [p for _, p in Stream(r, rk.prompts).read_after("0", pb.PromptGroup)][3:]
    assert [p.group_id for p in val] == ["val:2:held:00000", "val:2:held:00001", "val:2:held:00002"]
    assert [p.sampling.seed for p in val] == [p.sampling.seed for p in prompts]
    assert {k: v for k, v in figures["held"].items() if k != "seconds"} == {k: v for k, v in f.items() if k != "seconds"}
    assert runs["v"].validations() == {2: figures} and runs["v"].eval("1") == done
    # a finished eval leaves no group digests behind; a late replay of its group is acknowledged,
    # not counted and not dead-lettered
    assert not r.exists(rk.groups("eval:1"))
    dead_before = r.xlen(rk.dead_of("controller"))
    _, first = next(iter(Stream(r, rk.estimates).read_after("0", pb.ScoredGroup)))
    r.xadd(rk.estimates, codec.encode(first))
    receive(v2)
    assert runs["v"].evaluation_progress("eval:1") == (0, {}) and runs["v"].eval("1") == done
    assert r.xlen(rk.dead_of("controller")) == dead_before and r.xpending(rk.estimates, "controller")["pending"] == 0
    # an eval whose dataset is gone fails on its own; the run goes on
    second = runs["v"].create_eval({"datasets": ["held"], "samples": 2, "max_prompts": 1})
    registry.delete("held")
    failed = run_job(validation().eval_job(spec, second, 4, 0, 16), lambda: None)
    assert failed["status"] == "failed" and "held" in failed["error"]


# -- through the REST API and the driver ------------------------------------------------------------


@pytest.fixture
def api(r, tmp_path):
    settings = ControllerSettings(data_dir=tmp_path / "data", api_token=TOKEN, worker_wait_seconds=600)
    with TestClient(create_app(settings, r)) as c:
        yield c


class FakeServices:
    """A rollout worker serving policy version 0 (its heartbeat and loaded version) and a reward
    service scoring every held-out group, until stopped."""

    def __init__(self, r, run: str, limit: int | None = None):
        self.r, self.run, self.limit = r, run, limit
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self.beat()
        self.r.hset(keys.RunKeys(self.run).weight_versions, "fake-0", 0)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)
        self.r.delete(keys.heartbeat("rollout", "fake-0"))

    def beat(self):
        self.r.set(keys.heartbeat("rollout", "fake-0"), json.dumps({"run": self.run, "at": time.time()}), ex=60)

    def _loop(self):
        while not self.stop.wait(0.05):
            self.beat()
            scored = score(self.r, self.run, stop_after=self.limit)
            self.limit = None if self.limit is None else self.limit - scored


def wait_eval(api, run: str, eval_id: str, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while (body := api.get(f"/v1/runs/{run}/evals/{eval_id}").json())["status"] in ("pending", "running"):
        assert time.monotonic() < deadline, body
        time.sleep(0.05)
    return body


def wait_status(api, run: str, wanted: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while api.get(f"/v1/runs/{run}").json()["status"] != wanted:
        assert time.monotonic() < deadline, f"run {run} never reached {wanted}"
        time.sleep(0.05)


def test_evals_are_served_while_paused_or_waiting_and_bad_requests_are_refused(api, r, tmp_path, tiny_model_dir):
    data = tmp_path / "train.jsonl"
    task.write_jsonl(data, [task.record(t, "train", i) for i, t in enumerate(task.make_splits(7, 0, 6, 0)["train"])])
    assert api.post("/v1/datasets", json={"name": "held", "path": str(held_file(tmp_path))}, headers=AUTH).status_code == 201
    blank = tmp_path / "blank.jsonl"
    blank.write_text(json.dumps({"prompt": "2+2", "reward_model": {"ground_truth": "4"}}) + "\n" + json.dumps({"prompt": "?", "reward_model": {"ground_truth": ""}}) + "\n")
    assert api.post("/v1/datasets", json={"name": "blank", "path": str(blank)}, headers=AUTH).status_code == 201

    # a paused run: the eval is served at once on the version the rollout workers serve (0)
    run = {"name": "p", "model": str(tiny_model_dir), "datasets": [str(data)], "stages": [{"name": "s", "steps": 2, "T": 16, "D_R": 2, "gs": 2}]}
    assert api.post("/v1/runs", json=run, headers=AUTH).status_code == 201
    assert api.post("/v1/runs/p/pause", headers=AUTH).status_code == 200
    wait_status(api, "p", "paused")
    with FakeServices(r, "p"):
        resp = api.post("/v1/runs/p/evals", json={"datasets": ["held"], "samples": 4, "pass_k": 2}, headers=AUTH)
        assert resp.status_code == 202, resp.text
        assert resp.json()["status"] == "pending" and resp.json()["id"] == "1"
        body = wait_eval(api, "p", "1")
    assert body["status"] == "done" and body["policy_version"] == 0 and body["context_length"] == 16, body  # the stage's T
    f = body["figures"]["held"]
    assert f["avg_at_n"] == pytest.approx((0.25 + 0 + 1) / 3) and f["pass_at_k"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert api.get("/v1/runs/p").json()["status"] == "paused" and r.xlen(keys.RunKeys("p").scored) == 0  # nothing trained, nothing reached the learner
    assert [e["id"] for e in api.get("/v1/runs/p/evals").json()] == ["1"]
    assert api.get("/v1/runs/p/validation").json() == {}  # not a validation of the run

    # bad requests: the validation block's 422s, unknown run or eval 404
    def post(run_id="p", **body):
        return api.post(f"/v1/runs/{run_id}/evals", json={"datasets": ["held"], **body}, headers=AUTH)

    for bad, loc, why in [
        ({"datasets": ["nope"]}, ["body", "datasets", 0], "no dataset registered as 'nope'"),
        ({"datasets": ["blank"]}, ["body", "datasets", 0], "record blank:2 has no ground truth"),
        ({"samples": 0}, ["body", "samples"], "greater than or equal to 1"),
        ({"k": 2}, ["body"], "`k` is ambiguous here"),
        ({"n": 2, "pass_k": 3}, ["body"], "pass@k needs k <= n"),
        ({"T": 100_000}, ["body", "context_length"], "exceeds the model's context window 256"),
        ({"every": 2}, ["body", "every"], "Extra inputs"),
    ]:
        resp = post(**bad)
        assert resp.status_code == 422, (bad, resp.text)
        err = resp.json()["detail"][0]
        assert err["loc"] == loc and why in err["msg"], (bad, err)
    assert post("nobody").status_code == 404
    assert api.get("/v1/runs/nobody/evals/1").status_code == 404
    resp = api.get("/v1/runs/p/evals/7")
    assert resp.status_code == 404 and "no eval of run 'p' named '7'" in resp.json()["detail"]
    # one left pending when the run ends reads as failed, saying why; an ended run takes no eval
    assert post().status_code == 202
    assert api.post("/v1/runs/p/stop", headers=AUTH).json()["status"] == "stopped"
    left = api.get("/v1/runs/p/evals/2").json()
    assert left["status"] == "failed" and "ended (stopped) before the eval was served" in left["error"]
    resp = post()
    assert resp.status_code == 409 and "has ended (stopped)" in resp.json()["detail"] and "magic eval --local" in resp.json()["detail"]

    # a run with no stages waits: an eval-only run of a model directory (a checkpoint `magic
    # export`ed); T must be given, and the eval is served at once
    ckpt = {"name": "w", "model": str(tiny_model_dir), "datasets": ["held"]}
    assert api.post("/v1/runs", json=ckpt, headers=AUTH).status_code == 201
    wait_status(api, "w", "waiting")
    resp = post("w")
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body", "context_length"] and "no stage yet" in resp.json()["detail"][0]["msg"]
    with FakeServices(r, "w"):
        resp = post("w", samples=2, T=12)
        assert resp.status_code == 202
        body = wait_eval(api, "w", resp.json()["id"])
    assert body["status"] == "done" and (body["policy_version"], body["context_length"]) == (0, 12) and body["figures"]["held"]["samples"] == 2
    assert body["figures"]["held"]["avg_at_n"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert api.post("/v1/runs/w/stop", headers=AUTH).status_code == 200

    # a run no controller drives (created behind the API's back): 409 saying what to do instead
    Runs(r, tmp_path / "data").create(RunSpec(name="orphan", model=str(tiny_model_dir), datasets=["held"]))
    resp = post("orphan", T=12)
    assert resp.status_code == 409 and "no controller drives run 'orphan'" in resp.json()["detail"] and "magic eval --local" in resp.json()["detail"]


def test_a_controller_restarted_mid_eval_finishes_it_without_double_counting(r, tmp_path, tiny_model_dir):
    settings = ControllerSettings(data_dir=tmp_path / "data", api_token=TOKEN, worker_wait_seconds=600)
    rk = keys.RunKeys("p")
    with TestClient(create_app(settings, r)) as api:
        assert api.post("/v1/datasets", json={"name": "held", "path": str(held_file(tmp_path))}, headers=AUTH).status_code == 201
        run = {"name": "p", "model": str(tiny_model_dir), "datasets": ["held"], "stages": [{"name": "s", "steps": 2, "T": 16, "D_R": 2, "gs": 2}]}
        assert api.post("/v1/runs", json=run, headers=AUTH).status_code == 201
        assert api.post("/v1/runs/p/pause", headers=AUTH).status_code == 200
        wait_status(api, "p", "paused")
        with FakeServices(r, "p", limit=1):  # one of the three groups is scored, then the controller stops
            assert api.post("/v1/runs/p/evals", json={"datasets": ["held"], "samples": 4}, headers=AUTH).status_code == 202
            deadline = time.monotonic() + 20
            while len(r.hkeys(rk.evaluation("eval:1"))) < 2:  # `published` and one outcome
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert api.get("/v1/runs/p/evals/1").json()["status"] == "running"
    # a new controller resumes the paused run and finishes the eval it finds running
    with TestClient(create_app(settings, r)) as api, FakeServices(r, "p"):
        body = wait_eval(api, "p", "1")
        assert api.get("/v1/runs/p").json()["status"] == "paused"
    assert body["status"] == "done" and body["policy_version"] == 0
    assert body["figures"]["held"]["avg_at_n"] == pytest.approx((0.25 + 0 + 1) / 3) and body["figures"]["held"]["prompts"] == 3
    prompts = [p.group_id for _, p in Stream(r, rk.prompts).read_after("0", pb.PromptGroup)]
    assert prompts == ["eval:1:held:00000", "eval:1:held:00001", "eval:1:held:00002"]  # published once


def test_an_eval_that_cannot_be_served_when_the_plan_finishes_fails_alone(r, tmp_path, tiny_model_dir):
    """The plan has ended (its training done) while an eval waits and no rollout worker serves the
    final version: the eval fails saying why, and finishing the plan does not fail the run."""
    from magic.controller.driver import StepDriver

    settings = ControllerSettings(data_dir=tmp_path / "data", api_token=TOKEN, worker_wait_seconds=1)
    with TestClient(create_app(settings, r)) as api:
        assert api.post("/v1/datasets", json={"name": "held", "path": str(held_file(tmp_path))}, headers=AUTH).status_code == 201
        assert api.post("/v1/runs", json={"name": "f", "model": str(tiny_model_dir), "datasets": ["held"]}, headers=AUTH).status_code == 201
        wait_status(api, "f", "waiting")
        resp = api.post("/v1/runs/f/evals", json={"datasets": ["held"], "samples": 2, "T": 12}, headers=AUTH)
        assert resp.status_code == 202 and resp.json()["status"] == "pending"  # no rollout worker: it waits
        c = api.app.state.controller
        driver = StepDriver(c.runs, c.datasets, "f", settings)  # the run's driver, at the end of its plan
    assert driver.lease.try_acquire()
    driver._open_consumers()
    driver._finish_plan(0)  # returns: no RunFailed out of it
    body = driver.store.eval("1")
    assert body["status"] == "failed" and "final policy could not be evaluated" in body["error"] and "no rollout worker serves policy version 0" in body["error"], body
    driver.lease.release()
