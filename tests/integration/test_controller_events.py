"""The controller's inbox over a real Redis: events screened by the stream they arrive on (the
sending role), step completions written once, a worker's error failing the run only once its
service has no live worker."""

from __future__ import annotations

import json
import time

import pytest

from magic.controller.errors import RunFailed
from magic.controller.events import EventInbox
from magic.protocol import codec, keys
from magic.protocol.pb import messages_pb2 as pb
from magic.store.runs import Runs
from magic.store.streams import Stream

pytestmark = pytest.mark.integration

RUN = "inbox"
K = keys.RunKeys(RUN)


@pytest.fixture
def inbox(r, tmp_path):
    runs = Runs(r, tmp_path)
    channels = runs.channels(RUN, "controller-0", 5, heartbeat_ttl=2.0)
    r.hset(K.learner_state, "last_step", 3)
    return EventInbox(channels, channels.steps, runs[RUN], keys.CONTROLLER_GROUP, error_grace_seconds=0.5)


def send(r, role: str, **kind) -> str:
    return r.xadd(K.events_of(role), codec.encode(pb.Event(run_id=RUN, at=time.time(), source=f"{role}-0", **kind))).decode()


def letters(r) -> list[str]:
    return [d.reason for _, d in Stream(r, K.dead_of("controller")).read_after("0", pb.DeadLetter)]


def test_a_steps_completion_is_written_once(r, inbox):
    first = send(r, "learner", step_completed=pb.StepCompleted(step=2, metrics={"reward_mean": 0.25}))
    send(r, "learner", step_completed=pb.StepCompleted(step=2, new_version=42, metrics={"reward_mean": 0.987}))
    inbox.poll()
    inbox.groups["learner"]._recovery_cursor = "0"  # the same pending entry read again (as after a reclaim)
    inbox.poll()
    entry_id, done = inbox.take(2)
    assert entry_id == first and done.metrics["reward_mean"] == 0.25 and done.new_version == 0
    assert r.xpending(K.events_of("learner"), keys.CONTROLLER_GROUP)["pending"] == 1  # the first, acked with its record
    assert letters(r) == []  # a replay is acknowledged, not a poison


@pytest.mark.parametrize(
    "role, kind, why",
    [
        ("rollout", {"step_completed": pb.StepCompleted(step=1)}, "only the learner completes steps"),
        ("reward", {"step_completed": pb.StepCompleted(step=1)}, "only the learner completes steps"),
        ("learner", {"step_completed": pb.StepCompleted(step=4)}, "has committed step 3 only"),
        ("reward", {"worker_error": pb.WorkerError(service="learner", message="x")}, "naming service 'learner' on the reward role's stream"),
        ("rollout", {"worker_error": pb.WorkerError(service="reward", message="x")}, "naming service 'reward' on the rollout role's stream"),
    ],
)
def test_an_event_its_sender_may_not_send_is_dead_lettered(r, inbox, role, kind, why):
    send(r, role, **kind)
    inbox.poll()
    assert not inbox.completed
    (reason,) = letters(r)
    assert why in reason


def test_an_oversize_event_is_a_one_line_letter(r, inbox):
    r.xadd(K.events_of("reward"), {b"type": b"Event", b"pb": b"\x00" * 100_000})
    inbox.poll()
    (letter,) = [d for _, d in Stream(r, K.dead_of("controller")).read_after("0", pb.DeadLetter)]
    assert "100000 bytes from role reward, over 65536" in letter.reason and letter.payload == b"" and letter.payload_bytes == 100_000


def test_the_learners_error_fails_the_run(r, inbox):
    send(r, "learner", worker_error=pb.WorkerError(service="learner", message="loss is NaN"))
    with pytest.raises(RunFailed, match="loss is NaN"):
        inbox.poll()


def test_a_workers_error_fails_the_run_only_once_no_worker_of_its_service_is_live(r, inbox):
    beat = lambda name: r.set(keys.heartbeat("rollout", name), json.dumps({"run": RUN, "at": time.time()}), px=2000)  # noqa: E731
    beat("rollout-1")
    send(r, "rollout", worker_error=pb.WorkerError(service="rollout", message="CUDA error on one pod"))
    inbox.poll()  # rollout-1 is live: one pod's failure
    pending = lambda: r.xpending(K.events_of("rollout"), keys.CONTROLLER_GROUP)["pending"]  # noqa: E731
    assert pending() == 1  # kept pending while it may still fail the run: a restarted controller reads it again
    time.sleep(0.6)
    beat("rollout-1")
    inbox.poll()  # past the grace with a live worker: dropped
    assert pending() == 0
    r.delete(keys.heartbeat("rollout", "rollout-1"))
    inbox.poll()  # nothing pending any more: no failure
    send(r, "rollout", worker_error=pb.WorkerError(service="rollout", message="model is gone"))
    with pytest.raises(RunFailed, match="model is gone.*no rollout worker is live"):
        inbox.poll()
