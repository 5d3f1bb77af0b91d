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
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from waiting import answers, wait_for

from magic.demo import task
from magic.local.redis_server import free_port
from magic.local.supervisor import Supervisor
from magic.protocol import codec, keys
from magic.protocol.pb import messages_pb2 as pb
from magic.runtime import faults
from magic.store.streams import Stream

pytestmark = pytest.mark.e2e

SERVICES = {"controller": "magic.controller", "learner": "magic.learner", "rollout-0": "magic.rollout", "reward-0": "magic.reward"}
D_R, GS = 2, 2


class AofRedis:
    """A redis-server with its AOF fsynced on every write, restartable on the same port."""

    def __init__(self, workdir: Path):
        self.dir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "AofRedis":
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir), "--save", "",
             "--appendonly", "yes", "--appendfsync", "always"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        wait_for(lambda: _pings(client), 10, "redis-server")
        return self

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@dataclass
class World:
    sup: Supervisor
    server: AofRedis
    r: redis.Redis
    api: httpx.Client
    port: int
    data: Path
    model: Path

    def start(self, name: str, fault_points: list[str] | None = None) -> None:
        env = {"MAGIC_FAULT_POINTS": ",".join(fault_points or [])}
        if name == "controller":
            env |= {"MAGIC_PORT": str(self.port), "MAGIC_LEASE_SECONDS": "1.5", "MAGIC_TRIM_STREAMS": "false"}  # the checks audit the streams' history
        self.sup.start(name, SERVICES[name], env)

    def restart(self, name: str, fault_points: list[str] | None = None) -> None:
        if any(s.name == name for s in self.sup.services):
            svc = self.sup.get(name)
            if svc.proc.poll() is None:
                self.sup.kill(name)
            else:
                self.sup.services.remove(svc)
        self.start(name, fault_points)

    def submit(self, name: str, steps: int) -> None:
        wait_for(lambda: answers(f"http://127.0.0.1:{self.port}/readyz"), 60, "the controller", interval=0.05)
        active = self.r.get(keys.ACTIVE_RUN)
        if active is not None:  # a failed test's run: end it so that this test starts clean
            self.api.post(f"/v1/runs/{active.decode()}/stop")
            wait_for(lambda: self.r.get(keys.ACTIVE_RUN) is None, 60, "the previous run to stop")
        spec = {"name": name, "model": str(self.model), "datasets": [str(self.data)], "stages": [{"steps": steps, "T": 8, "D_R": D_R, "gs": GS, "lr": 1e-3}]}
        resp = self.api.post("/v1/runs", json=spec, timeout=60)  # services starting share 2 cores
        assert resp.status_code == 201, resp.text

    def status(self, name: str) -> dict | None:
        try:
            return self.api.get(f"/v1/runs/{name}").json()
        except httpx.HTTPError:
            return None  # the controller is restarting


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("faults")
    data = tmp / "train.jsonl"
    task.write_jsonl(data, [task.record(t, "train", i) for i, t in enumerate(task.make_splits(7, 0, 40, 0)["train"])])
    server = AofRedis(tmp / "redis").start()
    port = free_port()
    env = {"MAGIC_REDIS_URL": server.url, "MAGIC_DATA_DIR": str(tmp / "data"), "MAGIC_TORCH_THREADS": "1", "MAGIC_HEARTBEAT_TTL_SECONDS": "4"}
    w = World(Supervisor(tmp / "logs", env), server, redis.Redis.from_url(server.url), httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10), port, data, tiny_model_dir)
    for name in SERVICES:
        w.start(name)
    yield w
    w.sup.stop_all()
    server.stop()


def drive(w: World, run: str, fault_plan: dict[str, list[str]], timeout: float = 150) -> tuple[dict, list[str]]:
    """Wait for `run` to end; a service that SIGKILLed itself at a fault point is restarted with
    the points it has not reached yet (they are armed at increasing steps, so the first fired).
    Returns the final status and the points that fired, in order."""
    remaining = {name: list(points) for name, points in fault_plan.items()}
    fired: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for svc in list(w.sup.services):
            code = svc.proc.poll()
            if code is None:
                continue
            assert code == -9 and remaining.get(svc.name), f"{svc.name} exited {code} outside the fault plan:\n{svc.log_tail()}"
            fired.append(remaining[svc.name].pop(0))
            w.restart(svc.name, remaining[svc.name])
        status = w.status(run)
        if status and status["status"] in ("finished", "failed", "stopped"):
            return status, fired
        time.sleep(0.1)
    tails = "\n".join(f"--- {s.name}\n{s.log_tail(15)}" for s in w.sup.services)
    raise AssertionError(f"run {run} did not end within {timeout}s; fired {fired}\n{tails}")


def assert_exactly_once(w: World, run: str, steps: int, status: dict) -> None:
    """The promise: finished; each step recorded once, in order; each version announced once;
    each step trained on its D_R published groups, each once; the step's entries all acked."""
    assert status["status"] == "finished", status.get("error")
    k = keys.RunKeys(run)
    records = w.api.get(f"/v1/runs/{run}/metrics").json()
    assert [x["step"] for x in records] == list(range(steps))
    assert all(x["samples"] == D_R * GS and x["version_mismatch"] == 0 for x in records)
    completed = Counter(e.step_completed.step for _, e in Stream(w.r, k.events).read_after("0", pb.Event, count=10_000, poison=lambda *_: None)
                        if e.HasField("step_completed") and e.run_id == run and e.source == "learner")  # not the forged ones
    assert completed == {s: 1 for s in range(steps)}
    versions = [u.version for _, u in Stream(w.r, k.weights).read_after("0", pb.WeightUpdate, poison=lambda *_: None) if u.run_id == run]
    assert versions == list(range(steps + 1))
    published = Counter(g.step for _, g in Stream(w.r, k.prompts).read_after("0", pb.PromptGroup, count=10_000, poison=lambda *_: None)
                        if g.run_id == run and w.r.hexists(k.groups(g.step), g.group_id))
    assert published == {s: D_R for s in range(steps)}
    assert w.r.xpending(k.scored, "learner")["pending"] == 0
    assert w.r.xpending(k.events, "controller")["pending"] == 0


def test_fault_points_are_known():
    assert faults.parse("learner.announced@3,rollout.loaded") == {"learner.announced": 3, "rollout.loaded": None}
    with pytest.raises(ValueError, match="unknown fault point"):
        faults.parse("learner.anounced@3")


def test_every_service_killed_at_every_commit_point_of_the_step(world):
    """13 crashes in one 5-step run: each service dies at each of its commit points once, several
    services in the same step (their restarts overlap, which keeps the run short)."""
    plan = {
        "learner": [f"{p}@{i}" for i, p in enumerate(["learner.collected", "learner.trained", "learner.prepared", "learner.announced", "learner.committed"])],
        "controller": ["controller.published@0", "controller.completed@2", "controller.recorded@3"],
        "rollout-0": ["rollout.generated@0", "rollout.published@1", "rollout.loaded@2"],
        "reward-0": ["reward.scored@0", "reward.published@1"],
    }
    assert {p.split("@")[0] for points in plan.values() for p in points} == set(faults.POINTS)
    for name, points in plan.items():
        world.restart(name, points)
    try:
        world.submit("crashes", steps=5)
        status, fired = drive(world, "crashes", plan, timeout=400)  # 13 restarts
        assert_exactly_once(world, "crashes", 5, status)
        assert sorted(fired) == sorted(p for points in plan.values() for p in points), "every armed point was reached"
        assert world.r.xlen(keys.RunKeys("crashes").dead) == 0
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

    for stream, t in ((k.prompts, b"PromptGroup"), (k.rollouts, b"RolloutGroup"), (k.scored, b"ScoredGroup"), (k.events, b"Event")):
        put(stream, _entry(t, garbage), "poison message")  # bytes that do not parse
        put(stream, {b"junk": b"1"}, "lacks the 'type' or 'pb' field")  # not an entry of ours
    put(k.prompts, _entry(b"PromptGroup", event_bytes), "never published")  # an Event's bytes sent as a PromptGroup
    put(k.events, _entry(b"Event", prompt.SerializeToString()), "refused Event")  # a PromptGroup's bytes sent as an Event
    put(k.prompts, codec.encode(prompt), "never published")  # decodes, n = 0: the engine would refuse it
    put(k.rollouts, codec.encode(pb.RolloutGroup(prompt=prompt)), "never published")
    put(k.scored, codec.encode(pb.ScoredGroup(rollout=pb.RolloutGroup(prompt=prompt))), "never published")
    put(k.events, codec.encode(pb.Event(run_id=run, at=1.0, step_completed=pb.StepCompleted(step=7))), "has committed step")
    put(k.events, codec.encode(pb.Event(run_id="other", at=1.0, step_completed=pb.StepCompleted(step=0))), "event of run 'other'")
    wait_for(lambda: world.r.hexists(k.groups(0), "0:00000"), 60, "step 0 to be published")
    put(k.scored, codec.encode(pb.ScoredGroup(rollout=pb.RolloutGroup(prompt=forged_real_id, samples=[pb.Sample()]), scores=[pb.Score(reward=1)])),
        "differs from the one the controller published")  # a real group id with forged content
    wait_for(lambda: world.r.xlen(k.weights) >= 1, 60, "v0 to be announced")  # weights are followed from the newest announcement
    put(k.weights, _entry(b"WeightUpdate", garbage), "poison message")
    put(k.weights, codec.encode(pb.WeightUpdate(run_id="other", version=99)), "names run 'other'")

    status, _ = drive(world, run, {}, timeout=90)
    assert_exactly_once(world, run, 2, status)
    dead = [d for _, d in Stream(world.r, k.dead).read_after("0", pb.DeadLetter, count=1000)]
    by_entry = Counter((d.stream, d.entry_id) for d in dead)
    for (stream, entry_id), why in injected.items():
        assert by_entry[(stream, entry_id)] == 1, (stream, why, [d.reason for d in dead])
        reason = next(d.reason for d in dead if d.entry_id == entry_id and d.stream == stream)
        assert why in reason, (why, reason)
    assert len(dead) == len(injected), [d.reason for d in dead]


def test_redis_killed_and_restarted_from_its_aof_mid_step(world):
    run = "redis-restart"
    k = keys.RunKeys(run)
    world.submit(run, steps=3)
    wait_for(lambda: world.r.hget(k.state, "step") == b"1" and world.r.hget(k.state, "phase") == b"rollout", 90, "step 1 to be out", interval=0.02)
    world.server.kill()
    time.sleep(1.0)
    world.server.start()
    status, _ = drive(world, run, {}, timeout=120)
    assert_exactly_once(world, run, 3, status)
    assert world.r.xlen(k.dead) == 0
    assert all(s.proc.poll() is None for s in world.sup.services), "every service reconnected instead of exiting"


def test_random_sigkills_during_a_run(world):
    """The random chaos test, kept beside the targeted ones: SIGKILL a random service at a random
    moment, three times (seeded; MAGIC_CHAOS_SEED picks another schedule)."""
    rng = random.Random(int(os.environ.get("MAGIC_CHAOS_SEED", "7")))
    world.submit("chaos", steps=4)
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
