"""A controller that meets a Redis which lost writes reports the lost data, whatever the symptom it
met first (a step record missing, state that no longer adds up): the run ends `failed` saying Redis
lost data and what to do, in Redis and in the durable record the API falls back on."""

from __future__ import annotations

import pytest

from magic.config.schema import RunSpec
from magic.controller.datasets import DatasetRegistry
from magic.controller.driver import StepDriver
from magic.controller.settings import ControllerSettings
from magic.protocol import keys
from magic.store.datasets import DatasetIndex
from magic.store.runs import Runs

pytestmark = pytest.mark.integration

RUN = "lossy"


@pytest.fixture
def driver(r, tmp_path):
    runs = Runs(r, tmp_path)
    runs.create(RunSpec(name=RUN, model="/m", datasets=["d"], stages=[{"steps": 3, "T": 8, "D_R": 2, "gs": 2}]))
    d = StepDriver(runs, DatasetRegistry(DatasetIndex(r)), RUN, ControllerSettings(data_dir=tmp_path, lease_seconds=30))
    assert d.lease.try_acquire()
    for step in range(3):
        d.store.update(step=step)
    r.set(keys.RunKeys(RUN).seq(), 1)  # Redis came back from an older state
    yield runs, d
    d.lease.release()


def test_a_symptom_of_lost_writes_is_reported_as_lost_data(driver):
    runs, d = driver
    d._fail(KeyError("no record of step 2"))  # what the driver tripped over first
    state = runs[RUN].state()
    assert state["status"] == "failed"
    assert state["error"].startswith("Redis lost data: ") and "write counter seq is 1" in state["error"] and "checkpoint" in state["error"]
    assert runs[RUN].durable()["status"] == "failed"


def test_a_failure_redis_will_not_take_is_still_in_the_durable_record(driver, r):
    runs, d = driver
    d.lease.accept_loss = lambda: None  # Redis loses writes again between the report and its write
    d._fail(KeyError("no record of step 2"))
    assert r.hget(keys.RunKeys(RUN).state, "status") != b"failed"
    state = runs[RUN].state()  # what the API shows: the durable record's ended status wins
    assert state["status"] == "failed" and state["error"].startswith("Redis lost data: ")


def test_a_failure_in_a_redis_that_lost_nothing_is_reported_as_itself(r, tmp_path):
    runs = Runs(r, tmp_path)
    runs.create(RunSpec(name=RUN, model="/m", datasets=["d"], stages=[{"steps": 3, "T": 8, "D_R": 2, "gs": 2}]))
    d = StepDriver(runs, DatasetRegistry(DatasetIndex(r)), RUN, ControllerSettings(data_dir=tmp_path, lease_seconds=30))
    assert d.lease.try_acquire()
    d._fail(ValueError("a dataset row without a prompt"))
    assert runs[RUN].state()["error"] == "ValueError: a dataset row without a prompt"
    d.lease.release()
