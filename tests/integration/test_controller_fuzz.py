"""Schema-driven fuzzing of the controller's API (schemathesis over its OpenAPI spec, real Redis):
no request, valid or not, may get a 5xx. Bounded: a few dozen examples per operation, ~1 minute."""

from __future__ import annotations

import time

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from magic.controller.app import create_app
from magic.controller.settings import ControllerSettings
from magic.demo import task

pytestmark = pytest.mark.integration

TOKEN = "fuzz-token-0123456789abcdef0123"
EXAMPLES = 40
BUDGET_SECONDS = 60


def test_no_request_gets_a_server_error(r, tmp_path, tiny_model_dir):
    data = tmp_path / "train.jsonl"
    task.write_jsonl(data, [task.record(t, "train", i) for i, t in enumerate(task.make_splits(3, 0, 6, 0)["train"])])
    app = create_app(ControllerSettings(data_dir=tmp_path / "data", api_token=TOKEN, worker_wait_seconds=600), r)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    # schemathesis runs the app's lifespan once (at its first call) and keeps it running; the
    # setup below uses the same app through a client that starts no second lifespan
    assert schema["/v1/runs"]["GET"].Case().call().status_code == 200
    client = TestClient(app)
    # something for the path parameters to find: a dataset and a live run
    assert client.post("/v1/datasets", json={"name": "chain", "path": str(data)}, headers=headers).status_code == 201
    spec = {"name": "fuzzed", "model": str(tiny_model_dir), "datasets": ["chain"], "stages": [{"name": "a", "steps": 2, "T": 16, "D_R": 2, "gs": 2}]}
    assert client.post("/v1/runs", json=spec, headers=headers).status_code == 201
    operations = [op.ok() for op in schema.get_all_operations()]
    assert len(operations) >= 14
    failures: list[str] = []
    start = time.monotonic()
    seen = 0
    for op in operations:
        if time.monotonic() - start > BUDGET_SECONDS:
            break

        @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy())
        def fuzz(case) -> None:
            nonlocal seen
            if case.path_parameters and "run_id" in case.path_parameters and seen % 3 == 0:
                case.path_parameters["run_id"] = "fuzzed"  # also hit the live run, not only 404s
            seen += 1
            resp = case.call(headers=headers)
            if resp.status_code >= 500:
                failures.append(f"{case.method} {case.formatted_path} -> {resp.status_code}: {resp.text[:300]}")

        fuzz()
    # end the run and the app's lifespan so no driver thread outlives the test
    if client.get("/v1/runs/fuzzed").json()["status"] not in ("stopped", "finished", "failed"):
        client.post("/v1/runs/fuzzed/stop", headers=headers)
    from schemathesis.python.asgi import shutdown_lifespans

    shutdown_lifespans()
    assert seen >= len(operations) * 5
    assert not failures, "\n".join(failures[:10])
