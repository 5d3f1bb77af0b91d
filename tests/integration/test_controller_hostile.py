"""Hostile input to the controller's API (issue: exactly-once under every fault, item 8-9): non-
finite numbers and absurd sizes are 422s that store nothing; bodies are bounded and checked for
a token before anything parses them; a validation error never echoes a large body back."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from magic.controller.app import create_app
from magic.controller.settings import ControllerSettings
from magic.demo import task
from magic.protocol import keys

pytestmark = pytest.mark.integration

TOKEN = "t0ken-for-the-hostile-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


@pytest.fixture
def client(r, tmp_path):
    settings = ControllerSettings(data_dir=tmp_path / "data", api_token=TOKEN, max_body_bytes=64 * 1024)
    with TestClient(create_app(settings, r)) as c:
        yield c


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "train.jsonl"
    task.write_jsonl(path, [task.record(t, "train", i) for i, t in enumerate(task.make_splits(7, 0, 12, 0)["train"])])
    return path


def body(model, data, stage: str, optim: str = "{}") -> bytes:
    """A run spec as raw JSON text, so NaN / Infinity literals reach the server as sent."""
    return f'{{"name": "h", "model": "{model}", "datasets": ["{data}"], "optim": {optim}, "stages": [{stage}]}}'.encode()


@pytest.mark.parametrize(
    "stage, optim",
    [
        ('{"steps": 1, "T": 8, "D_R": 2, "gs": 2, "lr": NaN}', "{}"),
        ('{"steps": 1, "T": 8, "D_R": 2, "gs": 2, "tau": Infinity}', "{}"),
        ('{"steps": 1, "T": 8, "D_R": 2, "gs": 2, "clip_high": -Infinity}', "{}"),
        ('{"steps": 1, "T": 8, "D_R": 2, "gs": 2, "entropy": {"target": Infinity}}', "{}"),
        ('{"steps": 1, "T": 8, "D_R": 2, "gs": 2, "kl_coef": Infinity}', "{}"),
        ('{"steps": 1, "T": 8, "D_R": 2, "gs": 2, "entropy": {"coef_max": Infinity}}', "{}"),
        ('{"steps": 1, "T": 8, "D_R": 2, "gs": 2}', '{"betas": [NaN, 0.9]}'),
        ('{"steps": 1, "T": 8, "D_R": 1000000000000000000000000000000, "gs": 2}', "{}"),
        ('{"steps": 1, "T": 8, "D_R": 1000000000, "gs": 2}', "{}"),
    ],
)
def test_non_finite_or_absurd_numbers_are_422_and_store_nothing(client, r, tiny_model_dir, data, stage, optim):
    resp = client.post("/v1/runs", content=body(tiny_model_dir, data, stage, optim), headers=AUTH)
    assert resp.status_code == 422, resp.text
    assert resp.json()["detail"]  # a JSON answer naming the field
    assert not r.exists(keys.RunKeys("h").spec) and client.get("/v1/runs").json() == []
    assert client.get("/v1/runs/h").status_code == 404


def test_a_body_without_a_token_is_refused_before_it_is_read(client):
    resp = client.post("/v1/runs", content=b"x" * (10 * 1024 * 1024), headers={"Content-Type": "application/json"})
    assert resp.status_code == 401 and resp.headers["www-authenticate"] == "Bearer"
    assert client.post("/v1/runs", content=b"{}", headers={"Authorization": "Bearer wrong-token-0123456789"}).status_code == 401


def test_a_large_body_is_413_and_a_bad_one_is_not_echoed_back(client):
    assert client.post("/v1/runs", content=b" " * (65 * 1024), headers=AUTH).status_code == 413

    def chunks():  # no Content-Length: counted while read
        for _ in range(100):
            yield b" " * 1024

    assert client.post("/v1/runs", content=chunks(), headers=AUTH).status_code == 413
    resp = client.post("/v1/runs", content=b'{"name": "' + b"a" * 60_000 + b'"}', headers=AUTH)
    assert resp.status_code == 422 and len(resp.content) < 4096


@pytest.mark.parametrize("path", ["0" * 300 + ".jsonl", "data\u0000.jsonl", "\u0130" * 200])
def test_paths_the_filesystem_refuses_are_4xx_and_store_nothing(client, r, tiny_model_dir, data, path):
    """A path too long for the filesystem or with a NUL byte, as a dataset or as the model, is a
    client error naming the field (the fuzzer found the 500 an OSError used to give)."""
    resp = client.post("/v1/datasets", json={"name": "bad", "path": path}, headers=AUTH)
    assert 400 <= resp.status_code < 500 and resp.json()["detail"], resp.text
    assert client.get("/v1/datasets").json() == []
    spec = {"name": "h", "model": path, "datasets": [str(data)], "stages": [{"steps": 1, "T": 8, "D_R": 2, "gs": 2}]}
    resp = client.post("/v1/runs", json=spec, headers=AUTH)
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body", "model"], resp.text
    assert not r.exists(keys.RunKeys("h").spec) and client.get("/v1/runs").json() == []
