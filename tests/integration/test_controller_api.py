"""The controller's REST API over a real Redis: every endpoint's success and failure cases.

No worker runs here: a created run's driver waits for rollout workers, which is all these tests
need (they check the API, the stored state and the driver's reaction to pause/resume/stop).
"""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from magic.controller.app import create_app
from magic.controller.settings import ControllerSettings
from magic.demo import task
from magic.protocol import keys

pytestmark = pytest.mark.integration

TOKEN = "t0ken-for-the-api-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "train.jsonl"
    task.write_jsonl(path, [task.record(t, "train", i) for i, t in enumerate(task.make_splits(7, 0, 12, 0)["train"])])
    return path


@pytest.fixture
def client(r, tmp_path):
    settings = ControllerSettings(data_dir=tmp_path / "data", api_token=TOKEN, worker_wait_seconds=600)
    with TestClient(create_app(settings, r)) as c:
        yield c


def run_spec(model_dir, data, name="r1", **kw):
    stages = [{"name": "s1", "steps": 2, "T": 16, "D_R": 4, "gs": 2}, {"name": "s2", "steps": 2, "T": 24, "D_R": 4, "gs": 2}]
    return {"name": name, "model": str(model_dir), "datasets": [str(data)], "stages": stages, **kw}


def wait_status(client, run, wanted, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = client.get(f"/v1/runs/{run}").json()
        if body["status"] == wanted:
            return body
        time.sleep(0.05)
    raise AssertionError(f"run {run} never reached {wanted}: {body['status']}")


# -- auth ----------------------------------------------------------------------------------------


def test_mutating_endpoints_need_the_token_and_reads_do_not(client, tiny_model_dir, data):
    for method, path in [("post", "/v1/datasets"), ("post", "/v1/runs"), ("post", "/v1/runs/x/stages"), ("post", "/v1/runs/x/plan"),
                         ("post", "/v1/runs/x/pause"), ("post", "/v1/runs/x/resume"), ("post", "/v1/runs/x/stop"), ("delete", "/v1/datasets/x")]:
        resp = client.request(method.upper(), path, json={})
        assert resp.status_code == 401, (path, resp.text)
        assert resp.headers["www-authenticate"].startswith("Bearer")
        wrong = client.request(method.upper(), path, json={}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "invalid_token" in wrong.headers["www-authenticate"]
    for path in ("/v1/runs", "/v1/datasets", "/docs", "/openapi.json", "/livez", "/readyz", "/metrics"):
        assert client.get(path).status_code == 200, path


def test_reads_can_require_the_token_too(r, tmp_path, tiny_model_dir, data):
    """With read_requires_token every GET route of the API (enumerated from its OpenAPI) needs the
    token; the probes, /metrics and the API docs stay open."""
    settings = ControllerSettings(data_dir=tmp_path / "data", api_token=TOKEN, read_requires_token=True, worker_wait_seconds=600)
    app = create_app(settings, r)
    with TestClient(app) as c:
        assert c.post("/v1/runs", json=run_spec(tiny_model_dir, data), headers=AUTH).status_code == 201
        reads = [path for path, ops in app.openapi()["paths"].items() if path.startswith("/v1/") and "get" in ops]
        assert len(reads) >= 6
        for path in reads:
            path = path.replace("{run_id}", "r1").replace("{name}", "train")
            resp = c.get(path)
            assert resp.status_code == 401 and resp.headers["www-authenticate"].startswith("Bearer"), path
            assert c.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401, path
            assert c.get(path, headers=AUTH).status_code in (200, 404), path
        assert c.get("/v1/runs/r1", headers=AUTH).json()["name"] == "r1"
        for path in ("/livez", "/readyz", "/metrics", "/openapi.json"):
            assert c.get(path).status_code == 200, path
        c.post("/v1/runs/r1/stop", headers=AUTH)


def test_without_a_token_the_api_is_open_and_says_so(r, tmp_path, data, caplog):
    with caplog.at_level("WARNING"), TestClient(create_app(ControllerSettings(data_dir=tmp_path / "d"), r)) as c:
        assert c.post("/v1/datasets", json={"name": "open", "path": str(data)}).status_code == 201
    assert "WITHOUT authentication" in caplog.text


# -- datasets ------------------------------------------------------------------------------------


def test_datasets_register_validate_summarise(client, data, tmp_path):
    resp = client.post("/v1/datasets", json={"name": "chain", "path": str(data)}, headers=AUTH)
    assert resp.status_code == 201, resp.text
    info = resp.json()
    assert info["records"] == 12 and info["data_sources"] == {task.DATA_SOURCE: 12} and info["format"] == "jsonl"
    assert info["checksum"].startswith("sha256:") and info["prompt_chars"]["max"] >= info["prompt_chars"]["min"] > 0
    assert client.post("/v1/datasets", json={"name": "chain", "path": str(data)}, headers=AUTH).status_code == 200  # same file again
    assert [d["name"] for d in client.get("/v1/datasets").json()] == ["chain"]
    assert client.get("/v1/datasets/chain").json()["records"] == 12
    assert client.get("/v1/datasets/nope").status_code == 404

    other = tmp_path / "other.jsonl"
    other.write_text(data.read_text().splitlines()[0] + "\n")
    assert client.post("/v1/datasets", json={"name": "chain", "path": str(other)}, headers=AUTH).status_code == 409
    assert client.post("/v1/datasets?replace=true", json={"name": "chain", "path": str(other)}, headers=AUTH).json()["records"] == 1

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "reward_model": {"ground_truth": "1"}}\n{"prompt": "y"}\n')
    resp = client.post("/v1/datasets", json={"name": "bad", "path": str(bad)}, headers=AUTH)
    assert resp.status_code == 400 and "bad:2" in resp.json()["detail"] and "ground_truth" in resp.json()["detail"]
    assert client.post("/v1/datasets", json={"name": "gone", "path": str(tmp_path / "missing.jsonl")}, headers=AUTH).status_code == 400
    assert client.post("/v1/datasets", json={"name": "Bad Name", "path": str(data)}, headers=AUTH).status_code == 422
    assert client.delete("/v1/datasets/chain", headers=AUTH).status_code == 204
    assert client.delete("/v1/datasets/chain", headers=AUTH).status_code == 404


def test_parquet_datasets_in_verl_layout(client, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": [{"role": "user", "content": f"Add 1+{i}"}], "data_source": "math", "reward_model": {"ground_truth": str(1 + i), "style": "rule"}, "extra_info": {"index": i}} for i in range(5)]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    info = client.post("/v1/datasets", json={"name": "pq", "path": str(path)}, headers=AUTH).json()
    assert info["format"] == "parquet" and info["records"] == 5 and info["data_sources"] == {"math": 5}


def test_malformed_json_is_400_and_schema_errors_are_422(client):
    resp = client.post("/v1/datasets", content=b"{not json", headers={**AUTH, "content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["detail"][0]["type"] == "json_invalid"


# -- runs ----------------------------------------------------------------------------------------


def test_create_get_list_and_conflicts(client, r, tiny_model_dir, data):
    resp = client.post("/v1/runs", json=run_spec(tiny_model_dir, data), headers=AUTH)
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["name"] == "r1" and body["total_steps"] == 4 and body["spec"]["datasets"] == ["train"]
    assert body["status"] in ("pending", "running") and body["step"] == 0
    assert set(body["workers"]) == {"rollout", "reward", "learner"}
    assert client.get("/v1/datasets/train").json()["records"] == 12  # a path is registered on the fly
    assert [x["name"] for x in client.get("/v1/runs").json()] == ["r1"]
    wait_status(client, "r1", "running")  # the driver waits for rollout workers
    assert client.get("/v1/runs/r1/metrics").json() == []
    assert client.get("/v1/runs/nope").status_code == 404
    assert client.get("/v1/runs/nope/metrics").status_code == 404

    assert client.post("/v1/runs", json=run_spec(tiny_model_dir, data), headers=AUTH).status_code == 409  # same name
    busy = client.post("/v1/runs", json=run_spec(tiny_model_dir, data, name="r2"), headers=AUTH)
    assert busy.status_code == 409 and "r1" in busy.json()["detail"]  # one active run at a time
    assert r.get(keys.ACTIVE_RUN) == b"r1"


def test_run_validation_names_the_field(client, tiny_model_dir, data):
    def post(**kw):
        return client.post("/v1/runs", json=run_spec(tiny_model_dir, data, **kw), headers=AUTH)

    resp = post(stages=[{"steps": 2, "T": 16, "D_R": 8, "D_T": 3, "gs": 2}])
    assert resp.status_code == 422
    err = resp.json()["detail"][0]
    assert err["loc"][-1] == "D_T" and "not divisible" in err["msg"]
    resp = post(stages=[{"steps": 2, "T": 100_000, "D_R": 4, "gs": 2}])  # the tiny model's window is 256 tokens
    assert resp.status_code == 422
    err = resp.json()["detail"][0]
    assert err["loc"] == ["body", "stages", 0, "context_length"] and "max_position_embeddings" in err["msg"]
    resp = post(datasets=["not-registered"])
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body", "datasets", 0]
    resp = post(model="/no/such/model")
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body", "model"]
    resp = post(datasets=["/no/such/file.jsonl"])
    assert resp.status_code == 400
    resp = post(stages=[{"steps": 2, "T": 16, "D_R": 4, "gs": 2, "plateau": {"window": 5}}])
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"][-1] == "plateau"
    resp = post(stages=[{"steps": 2, "T": 16, "D_R": 4, "gs": 1}])
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"][-1] == "gs"
    assert client.get("/v1/runs").json() == []


def test_validation_block_bad_input_is_422_naming_the_field(client, tiny_model_dir, data, tmp_path):
    def post(**validation):
        return client.post("/v1/runs", json=run_spec(tiny_model_dir, data, validation={"datasets": ["held"], "every": 2, **validation}), headers=AUTH)

    resp = post()
    assert resp.status_code == 422
    err = resp.json()["detail"][0]
    assert err["loc"] == ["body", "validation", "datasets", 0] and "no dataset registered as 'held'" in err["msg"]
    blank = tmp_path / "blank.jsonl"
    blank.write_text(json.dumps({"prompt": "2+2", "reward_model": {"ground_truth": "4"}}) + "\n" + json.dumps({"prompt": "?", "reward_model": {"ground_truth": " "}}) + "\n")
    assert client.post("/v1/datasets", json={"name": "held", "path": str(blank)}, headers=AUTH).status_code == 201
    resp = post()
    assert resp.status_code == 422 and "record held:2 has no ground truth" in resp.json()["detail"][0]["msg"]
    resp = post(samples=0)
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"][-1] == "samples"
    resp = post(every=5)  # the plan runs 4 steps
    assert resp.status_code == 422 and "longer than the plan (4 steps)" in resp.json()["detail"][0]["msg"]
    resp = post(datasets=["train"], T=100_000)  # the tiny model's window is 256 tokens
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body", "validation", "context_length"]
    assert client.get("/v1/runs").json() == []


def test_pause_resume_stop(client, tiny_model_dir, data):
    client.post("/v1/runs", json=run_spec(tiny_model_dir, data), headers=AUTH)
    wait_status(client, "r1", "running")
    assert client.post("/v1/runs/r1/resume", headers=AUTH).status_code == 409  # not paused
    assert client.post("/v1/runs/r1/pause", headers=AUTH).json()["requested"] == ["pause"]
    wait_status(client, "r1", "paused")
    resp = client.post("/v1/runs/r1/resume", headers=AUTH)
    assert resp.status_code == 200 and resp.json()["status"] == "running"
    resp = client.post("/v1/runs/r1/stop", headers=AUTH)
    assert resp.status_code == 200 and resp.json()["status"] == "stopped"
    for action in ("pause", "resume", "stop"):
        assert client.post(f"/v1/runs/r1/{action}", headers=AUTH).status_code == 409
        assert client.post(f"/v1/runs/nope/{action}", headers=AUTH).status_code == 404
    # the run ended: a new one may start
    assert client.post("/v1/runs", json=run_spec(tiny_model_dir, data, name="r2"), headers=AUTH).status_code == 201


# -- stages --------------------------------------------------------------------------------------


def test_stages_and_plans_are_appended(client, r, tiny_model_dir, data):
    resp = client.post("/v1/runs", json=run_spec(tiny_model_dir, data, stages=[]), headers=AUTH)
    assert resp.status_code == 201 and resp.json()["spec"]["on_plan_end"] == "wait"
    wait_status(client, "r1", "waiting")  # no stage yet
    resp = client.post("/v1/runs/r1/stages", json={"name": "a", "steps": 3, "T": 16, "D_R": 4, "gs": 2, "tgt_ent": 0.3, "Delta": 0.01}, headers=AUTH)
    assert resp.status_code == 201, resp.text
    stage = resp.json()["spec"]["stages"][0]
    assert stage["entropy"]["target"] == 0.3 and stage["entropy"]["delta"] == 0.01
    wait_status(client, "r1", "running")
    assert client.post("/v1/runs/r1/stages", json={"name": "a", "steps": 1, "T": 16, "D_R": 4, "gs": 2}, headers=AUTH).status_code == 409
    assert client.post("/v1/runs/r1/stages", json={"name": "b", "steps": 1, "T": 16, "D_R": 4, "gs": 2, "bogus": 1}, headers=AUTH).status_code == 422
    resp = client.post("/v1/runs/r1/stages", json={"name": "b", "steps": 1, "T": 4096, "D_R": 4, "gs": 2}, headers=AUTH)
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body", "context_length"]
    assert client.post("/v1/runs/nope/stages", json={"name": "b", "steps": 1, "T": 16, "D_R": 4, "gs": 2}, headers=AUTH).status_code == 404

    plan = {"stages": [{"name": "b", "steps": 1, "T": 16, "D_R": 4, "gs": 2}, {"name": "c", "steps": 1, "T": 24, "D_R": 4, "gs": 2}], "on_plan_end": "finish"}
    resp = client.post("/v1/runs/r1/plan", json=plan, headers=AUTH)
    assert resp.status_code == 201 and [s["name"] for s in resp.json()["spec"]["stages"]] == ["a", "b", "c"]
    assert resp.json()["spec"]["on_plan_end"] == "finish"
    assert client.post("/v1/runs/r1/plan", json={"stages": []}, headers=AUTH).status_code == 422
    assert client.post("/v1/runs/r1/plan", json={"stages": [{"name": "b", "steps": 1, "T": 16, "D_R": 4, "gs": 2}]}, headers=AUTH).status_code == 409
    # all or nothing: a plan whose second stage clashes appends neither, nor changes on_plan_end
    clash = {"stages": [{"name": "d", "steps": 1, "T": 16, "D_R": 4, "gs": 2}, {"name": "c", "steps": 1, "T": 16, "D_R": 4, "gs": 2}], "on_plan_end": "wait"}
    assert client.post("/v1/runs/r1/plan", json=clash, headers=AUTH).status_code == 409
    assert client.get("/v1/runs/r1").json()["spec"]["on_plan_end"] == "finish"
    assert client.post("/v1/runs/nope/plan", json=plan, headers=AUTH).status_code == 404
    assert client.get("/v1/runs/nope/stages").status_code == 404
    view = client.get("/v1/runs/r1/stages").json()
    assert [s["name"] for s in view["plan"]] == ["a", "b", "c"] and view["started"][0]["name"] == "a"
    assert view["started"][0]["start_step"] == 0 and view["started"][0]["prompts"] == 12

    client.post("/v1/runs/r1/stop", headers=AUTH)
    assert client.post("/v1/runs/r1/stages", json={"name": "d", "steps": 1, "T": 16, "D_R": 4, "gs": 2}, headers=AUTH).status_code == 409


def test_status_reports_a_failed_step_with_its_error(client, r, tiny_model_dir, data):
    from magic.protocol.pb import messages_pb2 as pb
    from magic.store.streams import Stream

    client.post("/v1/runs", json=run_spec(tiny_model_dir, data), headers=AUTH)
    wait_status(client, "r1", "running")
    Stream(r, keys.RunKeys("r1").events_of("learner")).add(pb.Event(run_id="r1", source="learner-0", worker_error=pb.WorkerError(service="learner", message="loss is NaN at step 0")))
    body = wait_status(client, "r1", "failed")
    assert "loss is NaN" in body["error"] and r.get(keys.ACTIVE_RUN) is None


def test_pass_rates_endpoint(client, r, tiny_model_dir, data):
    client.post("/v1/runs", json=run_spec(tiny_model_dir, data), headers=AUTH)
    k = keys.RunKeys("r1")
    r.hset(k.pass_rates, mapping={"train:1": "0/4", "train:2": "2/4"})
    r.hset(k.dropped, "train:1", json.dumps({"from_stage": 0, "reason": "estimated_0"}))
    body = client.get("/v1/runs/r1/pass-rates").json()
    assert body["pass_rates"] == {"train:1": "0/4", "train:2": "2/4"} and body["filtering"]["dropped_estimated_0"] == 1
    assert client.get("/v1/runs/nope/pass-rates").status_code == 404


def test_livez_fails_while_a_run_driver_is_frozen_and_recovers(r, tmp_path, tiny_model_dir, data):
    """The driver's loop is frozen inside a real call (as on a Redis socket that never answers):
    /livez turns 503 naming the run once it has not come round for liveness_stall_seconds; the
    API itself still answers, and thawed, the controller is live again."""
    import threading

    settings = ControllerSettings(data_dir=tmp_path / "data", api_token=TOKEN, worker_wait_seconds=600, liveness_stall_seconds=0.5)
    with TestClient(create_app(settings, r)) as client:
        assert client.post("/v1/runs", json=run_spec(tiny_model_dir, data), headers=AUTH).status_code == 201
        wait_status(client, "r1", "running")
        assert client.get("/livez").status_code == 200
        driver = client.app.state.controller.drivers["r1"]
        thaw = threading.Event()
        sample = driver.stream_sampler.maybe_sample
        driver.stream_sampler.maybe_sample = lambda: (thaw.wait(30), sample())
        try:
            deadline = time.monotonic() + 10
            while (resp := client.get("/livez")).status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert resp.status_code == 503 and resp.text.startswith("hung: run r1: the main loop has made no progress"), resp.text
            assert client.get("/v1/runs/r1").status_code == 200
        finally:
            driver.stream_sampler.maybe_sample = sample
            thaw.set()
        deadline = time.monotonic() + 10
        while client.get("/livez").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.get("/livez").status_code == 200
        assert client.post("/v1/runs/r1/stop", headers=AUTH).status_code == 200


def test_the_metrics_port_serves_metrics_and_probes_apart_from_the_api(r, tmp_path):
    """MAGIC_METRICS_PORT (the chart sets it): /metrics, /livez and /readyz on a port of their own,
    which serves nothing of the API, so the API's port can stay closed to Prometheus."""
    import httpx

    from magic.runtime.ports import free_port

    port = free_port()
    settings = ControllerSettings(data_dir=tmp_path / "data", api_token=TOKEN, metrics_port=port)
    with TestClient(create_app(settings, r)):
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/livez").status_code == 200 and httpx.get(f"{base}/readyz").status_code == 200
        assert "magic_" in httpx.get(f"{base}/metrics").text
        assert httpx.get(f"{base}/v1/runs", headers=AUTH).status_code == 404  # no API there
    with pytest.raises(httpx.HTTPError):  # closed with the app
        httpx.get(f"http://127.0.0.1:{port}/livez", timeout=2)
