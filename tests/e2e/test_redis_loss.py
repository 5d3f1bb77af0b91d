"""Redis is checked, not trusted: Redis restarted with less than the services saw written — its AOF cut
by its last writes (as `appendfsync everysec` loses up to a second), restored from an older
snapshot, or empty — fails the run within 60 s with an error that says Redis lost data and what to
do, instead of stalling; the run stays listed by the API (the controller's durable record).

The four services run as processes over a real Redis; the faults are made to its files between a
SIGKILL and a restart, as a node loss and an operator's restore would."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest
import redis
from waiting import wait_for
from world import AofRedis, World, running_world

from magic.protocol import keys

pytestmark = pytest.mark.e2e

STEPS = 8


@pytest.fixture
def world(tmp_path, tiny_model_dir):
    with running_world(tmp_path, tiny_model_dir) as w:
        yield w


def recorded(w: World, run: str) -> int:
    try:
        return int(w.r.llen(keys.RunKeys(run).metrics))
    except redis.RedisError:
        return 0


def incr_aof(server: AofRedis) -> Path:
    """The AOF Redis appends to (Redis 7: appendonlydir/<name>.<n>.incr.aof)."""
    (path,) = (server.dir / "appendonlydir").glob("*.incr.aof")
    return path


def failed_within(w: World, run: str, seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    status: dict = {}
    while time.monotonic() < deadline:
        try:
            status = w.api.get(f"/v1/runs/{run}").json()
        except (httpx.HTTPError, ValueError):
            status = {}
        if status.get("status") == "failed":
            return status
        time.sleep(0.2)
    tails = "\n".join(f"--- {s.name}\n{s.log_tail(12)}" for s in w.sup.services)
    raise AssertionError(f"run {run} did not fail within {seconds:.0f}s (status {status.get('status')}, error {status.get('error')})\n{tails}")


def assert_failed_saying_redis_lost_data(w: World, run: str, status: dict) -> None:
    assert "Redis lost data" in status["error"] and "checkpoint" in status["error"], status["error"]
    assert run in [r["name"] for r in w.api.get("/v1/runs").json()], "the API still lists the run"
    assert w.api.get(f"/v1/runs/{run}").json()["status"] == "failed"


def test_an_aof_cut_by_its_last_writes_fails_the_run_at_once(world):
    run = "aof-tail"
    world.submit(run, steps=STEPS)
    wait_for(lambda: recorded(world, run) >= 2, 120, "step 1 recorded")
    cut = incr_aof(world.server).stat().st_size  # Redis will come back here: at step 1 or 2
    wait_for(lambda: recorded(world, run) >= 4, 120, "step 3 recorded")
    world.server.kill()
    with incr_aof(world.server).open("r+b") as f:
        f.truncate(cut)
    world.server.start()
    assert_failed_saying_redis_lost_data(world, run, failed_within(world, run, 60))


def test_a_restore_of_an_older_snapshot_fails_the_run_at_once(world):
    run = "old-snapshot"
    world.submit(run, steps=STEPS)
    wait_for(lambda: recorded(world, run) >= 2, 120, "step 1 recorded")
    world.r.save()
    backup = world.server.dir.parent / "backup.rdb"
    shutil.copy(world.server.dir / "dump.rdb", backup)
    wait_for(lambda: recorded(world, run) >= 4, 120, "step 3 recorded")
    world.server.kill()
    shutil.rmtree(world.server.dir)
    world.server.dir.mkdir()
    shutil.copy(backup, world.server.dir / "dump.rdb")  # what an operator restores
    world.server.start(aof=False)
    assert recorded(world, run) in (2, 3), "Redis came back at the snapshot"
    assert_failed_saying_redis_lost_data(world, run, failed_within(world, run, 60))


def test_redis_restarted_empty_fails_the_run_and_the_api_still_lists_it(world):
    run = "empty-redis"
    world.submit(run, steps=STEPS)
    wait_for(lambda: recorded(world, run) >= 2, 120, "step 1 recorded")
    world.server.kill()
    shutil.rmtree(world.server.dir)
    world.server.start()
    assert_failed_saying_redis_lost_data(world, run, failed_within(world, run, 60))
