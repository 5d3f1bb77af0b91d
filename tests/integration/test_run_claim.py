"""A run's keys are claimed when it is created: any key of the run already in Redis (made by a
process holding a worker role's credentials, or left over) refuses the run, naming the key, and
nothing of the run is written."""

from __future__ import annotations

import pytest

from magic.config.schema import RunSpec
from magic.protocol import keys
from magic.store.runs import KeySquatted, Runs, RunExists

pytestmark = pytest.mark.integration


def spec(name: str) -> RunSpec:
    return RunSpec(name=name, model="unused", train_files=["unused.jsonl"], stages=[{"steps": 1, "T": 8, "D_R": 2, "gs": 2}])


@pytest.mark.parametrize(
    "make, key, kind",
    [
        (lambda r, k: r.hset(k.prompts, "x", 1), "prompts", "hash"),  # the wrong type: the run would fail when it starts
        (lambda r, k: r.xadd(k.scored, {"type": "ScoredGroup", "pb": b""}), "scored", "stream"),  # a forged group waiting
        (lambda r, k: r.hset(k.weight_versions, "ghost", 999), "weight_versions", "hash"),
        (lambda r, k: r.xadd(k.events_of("rollout"), {"type": "Event", "pb": b""}), "events:rollout", "stream"),
        (lambda r, k: r.hset(k.step(5), "expected", 1), "step:5", "hash"),  # a key no worker role may make: found by the SCAN
    ],
)
def test_a_key_made_before_its_run_refuses_the_run(r, tmp_path, make, key, kind):
    k = keys.RunKeys("claimed")
    make(r, k)
    with pytest.raises(KeySquatted, match=rf"Redis already holds its key magic:\{{claimed\}}:{key} \(a {kind}\)"):
        Runs(r, tmp_path).create(spec("claimed"))
    assert r.get(k.spec) is None and not r.hgetall(k.state) and r.get(keys.ACTIVE_RUN) is None and not r.zrange(keys.RUN_INDEX, 0, -1)


def test_a_clean_run_is_created_and_a_second_one_of_its_name_is_refused(r, tmp_path):
    runs = Runs(r, tmp_path)
    runs.create(spec("clean"), {"max_prompt_tokens": 7})
    state = {a.decode(): b.decode() for a, b in r.hgetall(keys.RunKeys("clean").state).items()}
    assert state["status"] == "pending" and state["max_prompt_tokens"] == "7" and r.get(keys.ACTIVE_RUN) == b"clean"
    with pytest.raises(RunExists):
        runs.create(spec("clean"))
