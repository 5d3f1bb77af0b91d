"""A role's stolen credentials against a running platform: what a process that took the rollout's,
the reward's or the learner's Redis password (a sandbox escape in a reward pod hands over exactly
the reward's) can do to a run. The four services run as processes, each as its role's ACL user,
over a real Redis; the attacker connects with a role's credentials as a fifth process would.

Each attack either is refused by Redis (NOPERM) or reaches the controller, which refuses it with a
dead letter naming the reason; the run finishes with every step recorded once, as trained."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import redis
from waiting import wait_for
from world import World, assert_exactly_once, attacker, dead_letters, running_world

from magic.protocol import codec, keys
from magic.protocol.pb import messages_pb2 as pb
from magic.store.streams import Stream

pytestmark = pytest.mark.e2e

HEARTBEAT_TTL = "4"


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir):
    with running_world(
        tmp_path_factory.mktemp("bus-attacks"), tiny_model_dir, MAGIC_HEARTBEAT_TTL_SECONDS=HEARTBEAT_TTL, MAGIC_CHECKPOINT_EVERY="1",
        MAGIC_KEEP_CHECKPOINTS="10",
    ) as w:
        yield w


def recorded(w: World, run: str) -> int:
    return int(w.r.llen(keys.RunKeys(run).metrics))


def finish(w: World, run: str, timeout: float = 150) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = w.status(run)
        if status and status["status"] in ("finished", "failed", "stopped"):
            return status
        time.sleep(0.2)
    tails = "\n".join(f"--- {s.name}\n{s.log_tail(15)}" for s in w.sup.services)
    raise AssertionError(f"run {run} did not end within {timeout}s\n{tails}")


def refused(call) -> bool:
    try:
        call()
    except redis.exceptions.NoPermissionError:
        return True
    return False


def event(run: str, **kind) -> dict:
    return codec.encode(pb.Event(run_id=run, at=time.time(), source="learner-0", **kind))


def test_forged_events_heartbeats_claims_and_counters_change_nothing(world):
    run = "attacked"
    k = keys.RunKeys(run)
    world.submit(run, steps=4)
    wait_for(lambda: recorded(world, run) >= 2, 120, "step 1 recorded")
    rollout, reward, learner = attacker(world, "rollout"), attacker(world, "reward"), attacker(world, "learner")
    forged = pb.StepCompleted(step=1, new_version=42, metrics={"reward_mean": 0.987})

    # Redis refuses what crosses a role: another role's events, claims and reads of the learner's
    # queue, a run's state, the controller's write counter, the learner's counter reset
    pending = "0-1"  # the permission is checked before the entry is looked for
    assert refused(lambda: rollout.xadd(k.events_of("learner"), event(run, step_completed=forged)))
    assert refused(lambda: reward.xadd(k.events_of("learner"), event(run, worker_error=pb.WorkerError(service="learner", message="forged"))))
    assert refused(lambda: reward.xclaim(k.scored, "learner", "thief", 0, [pending]))
    assert refused(lambda: reward.xreadgroup("learner", "thief", {k.scored: "0"}))
    assert refused(lambda: reward.xack(k.scored, "learner", pending))
    assert refused(lambda: rollout.xack(k.events_of("learner"), "controller", "0-1"))
    assert refused(lambda: rollout.hset(k.state, "status", "finished"))
    assert refused(lambda: learner.delete(k.seq()))
    assert refused(lambda: learner.set(k.seq("learner"), 0))
    assert refused(lambda: learner.delete(k.seq("learner")))
    assert refused(lambda: learner.incrby(k.seq("learner"), -100))  # INCR only: a counter never goes back
    assert refused(lambda: learner.incr(k.seq()))
    assert refused(lambda: rollout.xadd(k.dead_of("learner"), {b"x": b"1"}))
    assert refused(lambda: reward.hset(k.weight_versions, "ghost", 0))

    # what each role may append to its own streams, the controller refuses by reason
    rollout.xadd(k.events_of("rollout"), event(run, step_completed=forged))
    reward.xadd(k.events_of("reward"), event(run, worker_error=pb.WorkerError(service="learner", message="forged")))
    reward.xadd(k.events_of("reward"), {b"type": b"Event", b"pb": b"\x00" * (1 << 20)})
    # a reward worker's own error while the reward service has a live worker: not the run's
    reward.xadd(k.events_of("reward"), event(run, worker_error=pb.WorkerError(service="reward", message="forged by a stolen password")))
    # an immortal heartbeat of a dead rollout worker that would hold the barrier at version 0,
    # and one with a TTL but a stale timestamp, and one from the future
    ghost = {"run": run, "at": time.time()}
    rollout.set(keys.heartbeat("rollout", "ghost"), json.dumps(ghost))
    rollout.set(keys.heartbeat("rollout", "stale"), json.dumps({**ghost, "at": time.time() - 3600}), px=10**9)
    rollout.set(keys.heartbeat("rollout", "future"), json.dumps({**ghost, "at": time.time() + 10**6}), px=10**9)
    for name in ("ghost", "stale", "future"):
        rollout.hset(k.weight_versions, name, 0)

    status = finish(world, run)
    assert_exactly_once(world, run, 4, status)
    records = world.api.get(f"/v1/runs/{run}/metrics").json()
    trained = {e.step_completed.step: e.step_completed for _, e in Stream(world.r, k.events_of("learner")).read_after("0", pb.Event)}
    assert [r["reward_mean"] for r in records] == pytest.approx([trained[s].metrics["reward_mean"] for s in range(4)])
    assert [r["policy_version"] for r in records] == list(range(4))
    reasons = [d.reason for d in dead_letters(world.r, run)]
    for why in ("only the learner completes steps", "naming service 'learner'", f"{1 << 20} bytes from role reward, over 65536"):
        assert sum(why in r for r in reasons) == 1, (why, reasons)
    big = next(d for d in dead_letters(world.r, run) if "over 65536" in d.reason)
    assert big.payload == b"" and big.payload_bytes == 1 << 20  # one line, not the megabyte
    log = world.sup.get("controller").log_tail(400)
    assert "heartbeat magic:hb:rollout:ghost is no live worker: it has no expiry" in log
    assert "magic:hb:rollout:stale is no live worker" in log and "magic:hb:rollout:future is no live worker" in log
    for name in ("ghost", "stale", "future"):
        world.r.delete(keys.heartbeat("rollout", name))


def test_a_key_made_before_its_run_refuses_the_run_naming_it(world):
    rollout, reward = attacker(world, "rollout"), attacker(world, "reward")
    k = keys.RunKeys("squatted")
    # a worker role can make a future run's keys only of their own type (its grants are typed) ...
    assert refused(lambda: reward.hset(k.scored, "x", 1))
    assert refused(lambda: rollout.set(k.weight_versions, "x"))
    # ... but it can make them: a forged group waiting in `scored`, a version of a worker that never was
    reward.xadd(k.scored, {b"type": b"ScoredGroup", b"pb": b""})
    rollout.hset(k.weight_versions, "ghost", 999)
    spec = {"name": "squatted", "model": str(world.model), "datasets": [str(world.data)], "stages": [{"steps": 1, "T": 8, "D_R": 2, "gs": 2}]}
    resp = world.api.post("/v1/runs", json=spec, timeout=60)
    assert resp.status_code == 409, resp.text
    detail = resp.json()["detail"]
    assert "cannot be created" in detail and ("magic:{squatted}:scored (a stream)" in detail or "magic:{squatted}:weight_versions (a hash)" in detail)
    assert world.r.get(k.spec) is None and not world.r.hgetall(k.state)  # nothing of the run was written
    world.r.delete(k.scored, k.weight_versions)


def test_junk_and_replayed_announcements_never_fail_the_run(world):
    """As the learner's credentials would: 70 junk entries on `weights` and a replay of v1's genuine
    announcement after v3; then a new learner and a new rollout worker attach (both start from the
    highest announced version, not the newest entry) and the run finishes."""
    run = "replayed"
    k = keys.RunKeys(run)
    world.submit(run, steps=5)
    wait_for(lambda: recorded(world, run) >= 3, 120, "step 2 recorded")
    assert world.api.post(f"/v1/runs/{run}/pause").status_code == 200
    wait_for(lambda: world.status(run)["status"] == "paused", 60, "the run to pause")
    learner = attacker(world, "learner")
    genuine = [(i, u) for i, u in Stream(world.r, k.weights).read_after("0", pb.WeightUpdate) if u.version == 1]
    learner.xadd(k.weights, codec.encode(genuine[-1][1]))
    for i in range(70):
        learner.xadd(k.weights, {b"type": b"WeightUpdate", b"pb": b"\xff junk %d" % i})
    world.restart("learner")
    world.restart("rollout-0")
    assert world.api.post(f"/v1/runs/{run}/resume").status_code == 200
    status = finish(world, run)
    assert status["status"] == "finished", status.get("error")
    assert [r["step"] for r in world.api.get(f"/v1/runs/{run}/metrics").json()] == list(range(5))
    reasons = [d.reason for d in dead_letters(world.r, run)]
    assert sum("poison message" in r for r in reasons) == 70, reasons
    assert sum("v1 is older than v3, announced before it (a replay)" in r for r in reasons) == 1, reasons


@pytest.mark.parametrize("b_checkpoints", [True, False], ids=["b-wrote-checkpoint-2", "no-checkpoint-2"])
def test_a_paused_learner_never_writes_a_checkpoint_once_replaced(world, b_checkpoints):
    """Learner A stops before training step 2 (SIGSTOP: a GC pause, a partition); learner B takes
    the lease and trains on. A, resumed, trains step 2 again and writes its checkpoint into a hidden
    directory, which never lands: where B wrote checkpoint 2, B's (a newer epoch) is kept untouched;
    where B wrote none, the fence (A no longer holds the lease) refuses the rename."""
    run = "ckpt-fenced-" + ("b" if b_checkpoints else "none")
    world.restart("learner", ["learner.collected@2:pause"])
    world.submit(run, steps=4)
    a = world.sup.get("learner")
    wait_for(lambda: Path(f"/proc/{a.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T", 90, "learner A to pause")
    world.sup.start("learner-b", "magic.learner", {**world.role_env("learner"), "MAGIC_CHECKPOINT_EVERY": "1" if b_checkpoints else "0"})
    ckpt = Path(world.sup.base_env["MAGIC_DATA_DIR"]) / "runs" / run / "checkpoints" / "step-00000003"  # the policy after step 2
    wait_for(lambda: recorded(world, run) >= 3, 120, "learner B to train step 2")
    if b_checkpoints:
        wait_for(lambda: (ckpt / "COMPLETE").exists(), 30, "learner B's checkpoint 2")
        before = (ckpt.stat().st_ino, (ckpt / "COMPLETE").read_text())
        assert json.loads(before[1])["epoch"] == 2  # A took epoch 1, B epoch 2
    os.kill(a.proc.pid, signal.SIGCONT)
    expected = "checkpoint step-00000003 exists and is intact (epoch 2): kept" if b_checkpoints else "checkpoint step-00000003 not written"
    wait_for(lambda: expected in a.log_tail(300), 60, f"A's copy dropped ({expected})")
    status = finish(world, run)
    assert_exactly_once(world, run, 4, status)
    if b_checkpoints:
        assert (ckpt.stat().st_ino, (ckpt / "COMPLETE").read_text()) == before
    else:
        assert not ckpt.exists() and "may no longer write" in a.log_tail(300)
    assert not list(ckpt.parent.glob(".step-*")), "A's hidden copy is removed"
    world.sup.kill("learner-b")
    world.restart("learner")
