"""Two writers: a controller or a learner paused (SIGSTOP) past its lease while a second one takes
over, then resumed (SIGCONT), as a GC pause, a partition or a force-deleted pod still running
would do. The paused writer must be unable to write at all once it lost its lease: every step is
recorded once, every version announced once with one checksum, every published group trained once;
the resumed writer stands by. Also: forged and mis-typed weight announcements are dead-lettered.

The services run as processes over a real Redis (AOF fsynced on every write); a process pauses
itself at a named point of the step (`MAGIC_FAULT_POINTS=controller.recording@1:pause`).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from waiting import wait_for
from world import World, assert_exactly_once, running_world

from magic.protocol import codec, keys
from magic.protocol.pb import messages_pb2 as pb
from magic.runtime.ports import free_port
from magic.store.streams import Stream

pytestmark = pytest.mark.e2e

LEASE = "1.5"  # the controllers' lease, seconds; the learners' is the heartbeat TTL below
HEARTBEAT_TTL = "4"


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir):
    with running_world(tmp_path_factory.mktemp("two-writers"), tiny_model_dir, MAGIC_HEARTBEAT_TTL_SECONDS=HEARTBEAT_TTL) as w:
        yield w


def paused(pid: int) -> bool:
    """The process is stopped (state T in /proc/<pid>/stat)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def second_controller(w: World) -> httpx.Client:
    """Another controller process (another pod) on its own port: it drives once the first one's lease expires."""
    port = free_port()
    w.sup.start("controller-b", "magic.controller", {"MAGIC_PORT": str(port), "MAGIC_LEASE_SECONDS": LEASE, "MAGIC_TRIM_STREAMS": "false", **w.role_env("controller")})
    return httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)


def recorded(w: World, run: str) -> int:
    return int(w.r.llen(keys.RunKeys(run).metrics))


def finish(w: World, run: str, api: httpx.Client, timeout: float = 150) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = api.get(f"/v1/runs/{run}").json()
        except httpx.HTTPError:
            status = None
        if status and status["status"] in ("finished", "failed", "stopped"):
            return status
        time.sleep(0.2)
    tails = "\n".join(f"--- {s.name}\n{s.log_tail(15)}" for s in w.sup.services)
    raise AssertionError(f"run {run} did not end within {timeout}s\n{tails}")


def reset(w: World, *extra: str) -> None:
    """Back to one process per service (the next case starts clean)."""
    for name in extra:
        if any(s.name == name for s in w.sup.services):
            w.sup.kill(name)
    for name in ("controller", "learner"):
        w.restart(name)


def announcements(w: World, run: str) -> list[pb.WeightUpdate]:
    return [u for _, u in Stream(w.r, keys.RunKeys(run).weights).read_after("0", pb.WeightUpdate, poison=lambda *_: None) if u.run_id == run]


@pytest.mark.parametrize("point", ["controller.recording@1", "controller.publishing@2"])
def test_a_controller_paused_inside_a_step_writes_nothing_once_its_lease_is_gone(world, point):
    """Controller A stops inside record_step(1) (its bookkeeping checked, before its MULTI) or
    publish_step(2); B takes the lease and drives steps on; A, resumed, can write nothing."""
    run = "pause-" + point.split(".")[1].split("@")[0]
    world.restart("controller", [f"{point}:pause"])
    world.submit(run, steps=4)
    a = world.sup.get("controller")
    wait_for(lambda: paused(a.proc.pid), 90, f"controller A to pause at {point}")
    b = second_controller(world)
    wait_for(lambda: recorded(world, run) >= 3, 120, "controller B to drive the run on")
    os.kill(a.proc.pid, signal.SIGCONT)
    status = finish(world, run, b)
    time.sleep(2 * float(LEASE))  # A had every chance to write after it resumed
    assert_exactly_once(world, run, 4, status, api=b)
    assert a.proc.poll() is None and "lease" in a.log_tail(30), "A stands by, having noticed its lost lease"
    reset(world, "controller-b")


def test_a_controller_paused_while_another_finishes_the_run_never_changes_it(world):
    """A pauses before marking the run finished; B finishes it and releases the lease; A, resumed,
    cannot take the released lease back (the run has ended) nor mark the run anything else."""
    run = "pause-finish"
    world.restart("controller", ["controller.finishing@2:pause"])
    world.submit(run, steps=2)
    a = world.sup.get("controller")
    wait_for(lambda: paused(a.proc.pid), 90, "controller A to pause before finishing")
    b = second_controller(world)
    assert finish(world, run, b)["status"] == "finished"
    os.kill(a.proc.pid, signal.SIGCONT)
    time.sleep(3 * float(LEASE))
    status = b.get(f"/v1/runs/{run}").json()
    assert status["status"] == "finished" and not status.get("error"), status
    assert_exactly_once(world, run, 2, status, api=b)
    assert world.r.get(keys.RunKeys(run).lease("controller")) is None
    reset(world, "controller-b")


@pytest.mark.parametrize("point", ["learner.trained@1", "learner.announced@1"])
def test_a_learner_paused_past_its_lease_writes_nothing(world, point):
    """Learner A stops after training step 1 (before its commit) or after announcing v2; learner B
    (another pod) takes the learner lease once A's expires, finishes step 1 and goes on; A,
    resumed, announces and commits nothing: each step completed once, each version announced
    once with one checksum."""
    run = "learner-" + point.split(".")[1].split("@")[0]
    world.restart("learner", [f"{point}:pause"])
    world.submit(run, steps=4)
    a = world.sup.get("learner")
    wait_for(lambda: paused(a.proc.pid), 90, f"learner A to pause at {point}")
    world.sup.start("learner-b", "magic.learner", world.role_env("learner"))
    wait_for(lambda: recorded(world, run) >= 3, 120, "learner B to train on")
    os.kill(a.proc.pid, signal.SIGCONT)
    status = finish(world, run, world.api)
    time.sleep(float(HEARTBEAT_TTL))
    assert_exactly_once(world, run, 4, status)
    updates = announcements(world, run)
    assert Counter(u.version for u in updates) == {v: 1 for v in range(5)}
    assert len({u.epoch for u in updates}) == 2 and all(u.checksum for u in updates)
    assert a.proc.poll() is None and "lease" in a.log_tail(40), "A stands by, having noticed its lost lease"
    reset(world, "learner-b")


def test_forged_and_mistyped_weight_announcements_are_dead_lettered(world):
    """A WeightUpdate for v999 under no learner epoch, and a PromptGroup's bytes typed as a
    WeightUpdate: the rollout worker dead-letters both with the reason; the run goes on, and a
    learner restarted after them does not take the forgery for the newest version."""
    run = "forged-weights"
    k = keys.RunKeys(run)
    world.submit(run, steps=3)
    wait_for(lambda: recorded(world, run) >= 1, 90, "step 0")
    forged = pb.WeightUpdate(run_id=run, version=999, transport="filesystem", uri="/nonexistent", checksum="sha256:" + "0" * 64, num_bytes=10)
    group = pb.PromptGroup(run_id=run, group_id="g", step=1, policy_version=1)
    group.messages.add(role="user", content="hi")
    world.r.xadd(k.weights, codec.encode(forged))
    world.r.xadd(k.weights, {codec.TYPE_FIELD: b"WeightUpdate", codec.PAYLOAD_FIELD: group.SerializeToString()})
    world.restart("learner")
    status = finish(world, run, world.api)
    assert_exactly_once(world, run, 3, status)
    reasons = [d.reason for _, d in Stream(world.r, k.dead_of("rollout")).read_after("0", pb.DeadLetter)]
    assert any("epoch 0 was never a learner lease's epoch" in r for r in reasons), reasons
    assert any("fields it does not define" in r for r in reasons), reasons
