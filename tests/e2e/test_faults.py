"""Fault injection: the four services as processes over a real Redis (AOF, fsync always), crashed
at every commit point of the step, fed each class of poison on each stream, and cut off from a
Redis that is killed and restarted mid-step.

Every case asserts the platform's promise (docs/architecture.md, "Persistence, faults and guarantees"): the
run finishes; every step is recorded once, in order; every version is announced once; every step
trained on its D_R published groups (so every published group was trained once); and anything
refused is in the dead-letter stream with its reason. Crashes are not random: each service is
started with ``MAGIC_FAULT_POINTS`` (`magic.runtime.faults`) and SIGKILLs itself at the named point.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter

import pytest
from waiting import wait_for
from world import SERVICES, assert_exactly_once, dead_letters, drive, running_world

from magic.protocol import codec, keys
from magic.protocol.pb import messages_pb2 as pb
from magic.runtime import faults
from magic.store.streams import Stream

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir):
    with running_world(tmp_path_factory.mktemp("faults"), tiny_model_dir, MAGIC_CHECKPOINT_EVERY="1") as w:
        yield w


def test_fault_points_are_known():
    assert faults.parse("learner.announced@3,rollout.loaded") == {"learner.announced": 3, "rollout.loaded": None}
    with pytest.raises(ValueError, match="unknown fault point"):
        faults.parse("learner.anounced@3")


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_every_service_killed_at_every_commit_point_of_the_step(world, max_staleness):
    """17 crashes in one 5-step run: each service dies at each of its commit points once, several
    services in the same step (their restarts overlap, which keeps the run short); on-policy
    (s = 0) and with bounded staleness s = 1 (step k + 1 published while step k trains)."""
    plan = {
        "learner": ["learner.collected@0", "learner.checkpoint_ready@0",  # the second: mid-checkpoint, on the writer's thread
                    *(f"{p}@{i}" for i, p in enumerate(["learner.trained", "learner.prepared", "learner.announced", "learner.committed"], start=1))],
        "controller": ["controller.published@0", "controller.publishing@1", "controller.completed@2", "controller.recording@2", "controller.recorded@3", "controller.finishing@5"],
        # with s = 1 a worker may skip a version (v3 and v4 announced while it was idle: it loads v4), so any load
        "rollout-0": ["rollout.generated@0", "rollout.published@1", "rollout.loaded" if max_staleness else "rollout.loaded@2"],
        "reward-0": ["reward.scored@0", "reward.published@1"],
    }
    assert {p.split("@")[0] for points in plan.values() for p in points} == set(faults.POINTS)
    for name, points in plan.items():
        world.restart(name, points)
    try:
        run = f"crashes-s{max_staleness}"
        world.submit(run, steps=5, max_staleness=max_staleness)
        status, fired = drive(world, run, plan, timeout=400)  # 17 restarts
        assert_exactly_once(world, run, 5, status)
        assert sorted(fired) == sorted(p for points in plan.values() for p in points), "every armed point was reached"
        assert not dead_letters(world.r, run)
    finally:
        for name in plan:  # disarmed for the next tests
            world.restart(name)


def _entry(msg_type: bytes, payload: bytes) -> dict[bytes, bytes]:
    return {codec.TYPE_FIELD: msg_type, codec.PAYLOAD_FIELD: payload}


def test_each_poison_class_on_each_stream_is_dead_lettered_and_the_run_goes_on(world):
    run = "poison"
    k = keys.RunKeys(run)
    world.submit(run, steps=2)
    garbage = b"\xff\xff\xff not protobuf"
    event_bytes = pb.Event(run_id=run, at=1.0, step_completed=pb.StepCompleted(step=0)).SerializeToString()
    prompt = pb.PromptGroup(run_id=run, group_id="0:99999", step=0, policy_version=0, sampling=pb.SamplingParams(n=0, max_tokens=8))
    forged_real_id = pb.PromptGroup(run_id=run, group_id="0:00000", step=0, policy_version=0, sampling=pb.SamplingParams(n=1, max_tokens=8))
    injected: dict[tuple[str, str], str] = {}  # (stream, entry id) -> expected reason; ids repeat across streams

    def put(stream: str, fields: dict, why: str) -> None:
        injected[(stream, world.r.xadd(stream, fields).decode())] = why

    for stream, t in ((k.prompts, b"PromptGroup"), (k.rollouts, b"RolloutGroup"), (k.scored, b"ScoredGroup"), (k.events_of("rollout"), b"Event")):
        put(stream, _entry(t, garbage), "poison message")  # bytes that do not parse
        put(stream, {b"junk": b"1"}, "lacks the 'type' or 'pb' field")  # not an entry of ours
    # one message's bytes sent as another type: they parse, with fields the type does not define
    put(k.prompts, _entry(b"PromptGroup", event_bytes), "fields it does not define")  # an Event's bytes sent as a PromptGroup
    put(k.events_of("reward"), _entry(b"Event", prompt.SerializeToString()), "fields it does not define")  # a PromptGroup's bytes sent as an Event
    put(k.prompts, codec.encode(prompt), "never published")  # decodes, n = 0: the engine would refuse it
    put(k.rollouts, codec.encode(pb.RolloutGroup(prompt=prompt)), "never published")
    put(k.scored, codec.encode(pb.ScoredGroup(rollout=pb.RolloutGroup(prompt=prompt))), "never published")
    put(k.events_of("learner"), codec.encode(pb.Event(run_id=run, at=1.0, step_completed=pb.StepCompleted(step=7))), "has committed step")
    put(k.events_of("reward"), codec.encode(pb.Event(run_id=run, at=1.0, step_completed=pb.StepCompleted(step=0))), "only the learner completes steps")
    put(k.events_of("rollout"), codec.encode(pb.Event(run_id=run, at=1.0, worker_error=pb.WorkerError(service="learner", message="forged"))), "naming service 'learner'")
    put(k.events_of("reward"), {b"type": b"Event", b"pb": b"x" * (65 << 10)}, "over 65536")
    put(k.events_of("learner"), codec.encode(pb.Event(run_id="other", at=1.0, step_completed=pb.StepCompleted(step=0))), "event of run 'other'")
    wait_for(lambda: world.r.hexists(k.groups(0), "0:00000"), 60, "step 0 to be published")
    put(k.scored, codec.encode(pb.ScoredGroup(rollout=pb.RolloutGroup(prompt=forged_real_id, samples=[pb.Sample()]), scores=[pb.Score(reward=1)])),
        "differs from the one the controller published")  # a real group id with forged content
    wait_for(lambda: world.r.xlen(k.weights) >= 1, 60, "v0 to be announced")  # weights are followed from the newest announcement
    put(k.weights, _entry(b"WeightUpdate", garbage), "poison message")
    put(k.weights, codec.encode(pb.WeightUpdate(run_id="other", version=99)), "names run 'other'")

    status, _ = drive(world, run, {}, timeout=90)
    assert_exactly_once(world, run, 2, status)
    dead = dead_letters(world.r, run)
    by_entry = Counter((d.stream, d.entry_id) for d in dead)
    for (stream, entry_id), why in injected.items():
        assert by_entry[(stream, entry_id)] == 1, (stream, why, [d.reason for d in dead])
        reason = next(d.reason for d in dead if d.entry_id == entry_id and d.stream == stream)
        assert why in reason, (why, reason)
    assert len(dead) == len(injected), [d.reason for d in dead]


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_redis_killed_and_restarted_from_its_aof_mid_step(world, max_staleness):
    run = f"redis-restart-s{max_staleness}"
    k = keys.RunKeys(run)
    world.submit(run, steps=3, max_staleness=max_staleness)
    # mid-step: step 1 or 2 out, its groups generating or its weights loading. One atomic read of both
    # fields (two HGETs could straddle the barrier's move). Not "step 1, rollout" alone: with s = 1 step 1
    # was generated while step 0 trained, so its rollout phase can last a few milliseconds.
    mid_step = {(b"1", b"rollout"), (b"1", b"sync"), (b"2", b"rollout"), (b"2", b"sync")}
    wait_for(lambda: tuple(world.r.hmget(k.state, "step", "phase")) in mid_step, 90, "step 1 or 2 to be out", interval=0.02)
    world.server.kill()
    time.sleep(1.0)
    world.server.start()
    status, _ = drive(world, run, {}, timeout=120)
    assert_exactly_once(world, run, 3, status)
    assert not dead_letters(world.r, run)
    assert all(s.proc.poll() is None for s in world.sup.services), "every service reconnected instead of exiting"


def test_random_sigkills_during_a_run(world):
    """The random chaos test, kept beside the targeted ones: SIGKILL a random service at a random
    moment, three times (seeded; MAGIC_CHAOS_SEED picks another schedule), with bounded staleness
    s = 1 (the run's steps overlap: the kills land between more kinds of state)."""
    rng = random.Random(int(os.environ.get("MAGIC_CHAOS_SEED", "7")))
    world.submit("chaos", steps=4, max_staleness=1)
    for _ in range(3):
        time.sleep(rng.uniform(0.5, 4.0))
        world.restart(rng.choice(list(SERVICES)))  # SIGKILL, then start again
    status, _ = drive(world, "chaos", {}, timeout=150)
    assert_exactly_once(world, "chaos", 4, status)


def test_every_service_exits_0_on_sigterm(world):
    """A requested stop is not a crash: every service (the controller included) exits 0."""
    for svc in world.sup.services:
        os.killpg(svc.proc.pid, signal.SIGTERM)
    codes = {svc.name: svc.proc.wait(30) for svc in world.sup.services}
    assert codes == {name: 0 for name in SERVICES}, {s.name: s.log_tail(5) for s in world.sup.services}
