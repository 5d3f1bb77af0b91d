"""An external Redis behind Sentinel, for real: a master, a replica and a sentinel as processes. The
services' client (`magic.store.client.connect`) finds the master through the sentinel, and after
the master is killed and the sentinel promotes the replica, the same client writes to the new
master."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import redis
from waiting import wait_for

from magic.runtime.ports import free_port
from magic.store.client import connect

pytestmark = pytest.mark.integration


def _redis(port: int, workdir: Path, *extra: str) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir), "--save", "", "--appendonly", "no", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: _pings(port), 10, f"redis-server :{port}")
    return proc


def _pings(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_connect_timeout=0.2).ping())
    except redis.RedisError:
        return False


@pytest.fixture
def sentinel_world(tmp_path):
    master_port, replica_port, sentinel_port = free_port(), free_port(), free_port()
    procs = {"master": _redis(master_port, tmp_path / "m"), "replica": _redis(replica_port, tmp_path / "r", "--replicaof", "127.0.0.1", str(master_port))}
    wait_for(lambda: redis.Redis(port=replica_port).info("replication")["master_link_status"] == "up", 10, "the replica to sync")
    conf = tmp_path / "sentinel.conf"  # the sentinel rewrites its config file: a writable one of its own
    conf.write_text(f"port {sentinel_port}\nbind 127.0.0.1\nsentinel monitor magic 127.0.0.1 {master_port} 1\n"
                    "sentinel down-after-milliseconds magic 500\nsentinel failover-timeout magic 5000\n")
    procs["sentinel"] = subprocess.Popen(["redis-server", str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: _pings(sentinel_port), 10, "redis-sentinel")
    wait_for(lambda: redis.Redis(port=sentinel_port).execute_command("SENTINEL", "REPLICAS", "magic"), 15, "the sentinel to see the replica")
    try:
        yield f"redis+sentinel://127.0.0.1:{sentinel_port}/magic/0", master_port, replica_port, procs
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_the_client_follows_the_master_through_a_failover(sentinel_world):
    url, master_port, replica_port, procs = sentinel_world
    r = connect(url, socket_timeout=2, socket_connect_timeout=1)
    r.set("before", "1")
    assert r.connection_pool.get_master_address() == ("127.0.0.1", master_port)
    assert r.wait(1, 2000) == 1  # the replica has it (replication is asynchronous: WAIT makes sure)
    procs["master"].kill()
    procs["master"].wait()
    t0 = time.monotonic()
    r.set("after", "2")  # rides the failover: retried until the sentinel names the new master
    took = time.monotonic() - t0
    assert r.connection_pool.get_master_address() == ("127.0.0.1", replica_port)
    assert redis.Redis(port=replica_port).mget("before", "after") == [b"1", b"2"]
    assert took < 30, took


def test_a_malformed_sentinel_url_is_refused_before_connecting():
    with pytest.raises(ValueError, match="the path must be"):
        connect("redis+sentinel://127.0.0.1:1")
