"""The fault suites' world: the four services as processes over a real Redis whose AOF is fsynced on
every write, each service as its role's ACL user (as the chart deploys them), and what every fault
case asserts of a run (its promise: each step once; no service ever refused by an ACL)."""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis
from waiting import answers, wait_for

from magic.demo import task
from magic.local.supervisor import Supervisor
from magic.protocol import keys
from magic.protocol.pb import messages_pb2 as pb
from magic.runtime.ports import free_port
from magic.store import acl
from magic.store.streams import Stream

SERVICES = {"controller": "magic.controller", "learner": "magic.learner", "rollout-0": "magic.rollout", "reward-0": "magic.reward"}
PASSWORDS = {role: f"{role}-pw-e2e" for role in acl.ROLES}
"""Each role's ACL user's password (the users come from an ACL file, so they outlive restarts)."""
D_R, GS = 2, 2


class AofRedis:
    """A redis-server with its AOF fsynced on every write, restartable on the same port, with the
    roles' ACL users from an ACL file (`magic.store.acl`; the default user stays the admin's)."""

    def __init__(self, workdir: Path):
        self.dir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def role_url(self, role: str) -> str:
        return acl.url_for(self.url, role, PASSWORDS[role])

    def start(self, aof: bool = True) -> "AofRedis":
        """Start (again, on the same port); `aof=False` loads `dump.rdb` instead (an operator's restore:
        Redis 7 with its AOF on and no AOF files starts empty)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "users.acl").write_text(acl.acl_file(PASSWORDS))
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir), "--save", "", "--aclfile", str(self.dir / "users.acl"),
             "--appendonly", "yes" if aof else "no", "--appendfsync", "always"],
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

    def role_env(self, name: str) -> dict[str, str]:
        """The Redis URL of service `name`'s role ("rollout-0" -> the rollout user)."""
        return {"MAGIC_REDIS_URL": self.server.role_url(name.split("-")[0])}

    def start(self, name: str, fault_points: list[str] | None = None) -> None:
        env = {"MAGIC_FAULT_POINTS": ",".join(fault_points or []), **self.role_env(name)}
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

    def submit(self, name: str, steps: int, **stage) -> None:
        """Start run `name`: one stage of `steps` (T 8, D_R, gs), `stage` adding settings (max_staleness, ...)."""
        wait_for(lambda: answers(f"http://127.0.0.1:{self.port}/readyz"), 60, "the controller", interval=0.05)
        active = self.r.get(keys.ACTIVE_RUN)
        if active is not None:  # a failed test's run: end it so that this test starts clean
            self.api.post(f"/v1/runs/{active.decode()}/stop")
            wait_for(lambda: self.r.get(keys.ACTIVE_RUN) is None, 60, "the previous run to stop")
        spec = {"name": name, "model": str(self.model), "datasets": [str(self.data)], "stages": [{"steps": steps, "T": 8, "D_R": D_R, "gs": GS, "lr": 1e-3, **stage}]}
        resp = self.api.post("/v1/runs", json=spec, timeout=60)  # services starting share 2 cores
        assert resp.status_code == 201, resp.text

    def status(self, name: str) -> dict | None:
        try:
            return self.api.get(f"/v1/runs/{name}").json()
        except httpx.HTTPError:
            return None  # the controller is restarting


@contextmanager
def running_world(tmp: Path, model: Path, **env: str) -> Iterator[World]:
    """The four services as processes over an `AofRedis` under `tmp`, with the demo's training
    file; `env` adds MAGIC_* settings every service gets. Stopped, Redis included, on exit."""
    data = tmp / "train.jsonl"
    task.write_jsonl(data, [task.record(t, "train", i) for i, t in enumerate(task.make_splits(7, 0, 40, 0)["train"])])
    server = AofRedis(tmp / "redis").start()
    port = free_port()
    base = {"MAGIC_REDIS_URL": server.url, "MAGIC_DATA_DIR": str(tmp / "data"), "MAGIC_TORCH_THREADS": "1", "MAGIC_HEARTBEAT_TTL_SECONDS": "4"}
    w = World(Supervisor(tmp / "logs", {**base, **env}), server, redis.Redis.from_url(server.url), httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10), port, data, model)
    try:
        for name in SERVICES:
            w.start(name)
        w.r.acl_log_reset()
        yield w
        assert_no_refusal(w.r)
    finally:
        w.sup.stop_all()
        server.stop()


ATTACKER = "attacker"
"""The client name of a test's hostile connections (their refusals are the test's, not a service's)."""


def attacker(w: World, role: str) -> redis.Redis:
    """A connection holding `role`'s credentials, as a process that stole them would have."""
    return redis.Redis.from_url(w.server.role_url(role), client_name=ATTACKER)


def assert_no_refusal(r: redis.Redis) -> None:
    """No service was refused a command by its role's ACL (Redis's ACL LOG: user, command, key)."""
    refused = [(e["username"], e["reason"], e["object"], info.get("cmd"))
               for e in r.acl_log(count=1000) if e["username"] != "default" and (info := e["client-info"]).get("name") != ATTACKER]
    assert not refused, f"a service was refused by its ACL: {refused}"


def dead_letters(r: redis.Redis, run: str) -> list[pb.DeadLetter]:
    """Every dead letter of `run`, of every role."""
    return [d for key in keys.RunKeys(run).dead_streams() for _, d in Stream(r, key).read_after("0", pb.DeadLetter, count=10_000)]


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


def assert_exactly_once(w: World, run: str, steps: int, status: dict, api: httpx.Client | None = None) -> None:
    """The promise: finished; each step recorded once, in order; each version announced once (by
    a learner holding the lease: forgeries aside); each step trained on its D_R published groups,
    each once; the step's entries all acked. `api`: the controller to ask (default: the world's)."""
    assert status["status"] == "finished", status.get("error")
    k = keys.RunKeys(run)
    records = (api or w.api).get(f"/v1/runs/{run}/metrics").json()
    assert [x["step"] for x in records] == list(range(steps))
    assert all(x["samples"] == D_R * GS and x["version_mismatch"] == 0 for x in records)
    completed = Counter(e.step_completed.step for _, e in Stream(w.r, k.events_of("learner")).read_after("0", pb.Event, count=10_000, poison=lambda *_: None)
                        if e.HasField("step_completed") and e.run_id == run and e.source.startswith("learner"))  # not the forged ones
    assert completed == {s: 1 for s in range(steps)}
    versions = [u.version for _, u in Stream(w.r, k.weights).read_after("0", pb.WeightUpdate, poison=lambda *_: None) if u.run_id == run and u.epoch > 0]
    assert versions == list(range(steps + 1))
    published = Counter(g.step for _, g in Stream(w.r, k.prompts).read_after("0", pb.PromptGroup, count=10_000, poison=lambda *_: None)
                        if g.run_id == run and w.r.hexists(k.groups(g.step), g.group_id))
    assert published == {s: D_R for s in range(steps)}
    assert w.r.xpending(k.scored, "learner")["pending"] == 0
    assert w.r.xpending(k.events_of("learner"), "controller")["pending"] == 0


