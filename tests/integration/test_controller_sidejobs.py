"""The side jobs' one interface over a real Redis: scored groups on the `estimates` stream go to
the receiver registered for their kind, in one batch per kind; a kind nobody takes now, a poison
entry and a training group sent there are dead-lettered with the reason; a job runs to its end by
`advance` alone."""

from __future__ import annotations

import pytest

from magic.config.schema import RunSpec
from magic.controller.sidejobs import Done, SideJobs
from magic.protocol import codec, keys
from magic.protocol.pb import messages_pb2 as pb
from magic.store.runs import Runs
from magic.store.streams import Stream

pytestmark = pytest.mark.integration


class Recorder:
    def __init__(self, estimates):
        self.estimates, self.batches = estimates, []

    def receive(self, batch):
        self.batches.append([g.rollout.prompt.group_id for _, g in batch])
        self.estimates.ack(*(e.id for e, _ in batch))


def scored(kind: int, group_id: str) -> dict:
    return codec.encode(pb.ScoredGroup(rollout=pb.RolloutGroup(prompt=pb.PromptGroup(run_id="s", group_id=group_id, kind=kind))))


def test_scored_groups_reach_the_receiver_of_their_kind_and_the_rest_is_dead_lettered(r, tmp_path):
    runs = Runs(r, tmp_path / "data")
    runs.create(RunSpec(name="s", model="m", datasets=["x"], stages=[{"steps": 1, "T": 8, "D_R": 1, "gs": 2}]))
    estimates = runs.channels("s", "controller-0", 5).group("estimates", keys.CONTROLLER_GROUP)
    rk = keys.RunKeys("s")
    jobs = SideJobs(estimates)
    validation = Recorder(estimates)
    jobs.register(pb.GROUP_KIND_VALIDATE, validation)
    r.xadd(rk.estimates, scored(pb.GROUP_KIND_VALIDATE, "val:1:held:00000"))
    r.xadd(rk.estimates, scored(pb.GROUP_KIND_ESTIMATE, "est:0000000"))  # the run estimates nothing now
    r.xadd(rk.estimates, scored(pb.GROUP_KIND_TRAIN, "0:00000"))  # a training group belongs on `scored`
    r.xadd(rk.estimates, {b"type": b"ScoredGroup", b"pb": b"\xff not protobuf"})
    r.xadd(rk.estimates, scored(pb.GROUP_KIND_VALIDATE, "val:1:held:00001"))
    assert jobs.route() == 5
    assert validation.batches == [["val:1:held:00000", "val:1:held:00001"]]  # one batch per kind
    dead = [d.reason for _, d in Stream(r, rk.dead_of("controller")).read_after("0", pb.DeadLetter)]
    assert len(dead) == 3
    assert any("GROUP_KIND_ESTIMATE group nobody takes now" in d and "GROUP_KIND_VALIDATE" in d for d in dead)
    assert any("GROUP_KIND_TRAIN group nobody takes now" in d for d in dead)
    # an estimation registers while it runs: its groups reach it, then nobody again
    estimation = Recorder(estimates)
    jobs.register(pb.GROUP_KIND_ESTIMATE, estimation)
    r.xadd(rk.estimates, scored(pb.GROUP_KIND_ESTIMATE, "est:0000001"))
    jobs.route()
    jobs.unregister(pb.GROUP_KIND_ESTIMATE)
    r.xadd(rk.estimates, scored(pb.GROUP_KIND_ESTIMATE, "est:0000002"))
    jobs.route()
    assert estimation.batches == [["est:0000001"]] and r.xlen(rk.dead_of("controller")) == 4
    assert r.xpending(rk.estimates, keys.CONTROLLER_GROUP)["pending"] == 0  # everything acknowledged or dead-lettered


def test_a_job_found_done_needs_no_worker():
    job = Done({"held": {"avg_at_n": 0.5}})
    assert job.version is None and job.advance() and job.result() == {"held": {"avg_at_n": 0.5}}
