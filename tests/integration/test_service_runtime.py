"""The service runtime (magic.runtime.service.serve) over a real Redis: a fatal error reaches the
run as a WorkerError; a Redis refusal or outage is waited out and the worker re-attached."""

from __future__ import annotations

import os
import signal

import pytest
import redis

from magic.config.settings import ServiceSettings
from magic.protocol import keys
from magic.protocol.pb import messages_pb2 as pb
from magic.runtime.service import Worker, serve
from magic.store.client import is_retryable
from magic.store.streams import Stream

pytestmark = pytest.mark.integration


class Scripted(Worker):
    """A worker whose polls follow a script: raise the given exception, or stop the process."""

    def __init__(self, script: list):
        self.script = script

    def poll(self) -> None:
        step = self.script.pop(0)
        if step == "stop":
            os.kill(os.getpid(), signal.SIGTERM)  # serve's handler ends the loop
        elif isinstance(step, BaseException):
            raise step


def settings(redis_server) -> ServiceSettings:
    return ServiceSettings(redis_url=redis_server.url, worker_name="w-0", heartbeat_seconds=0.2)


def test_a_watched_key_that_changed_is_not_an_outage():
    assert not is_retryable(redis.WatchError("Watched variable changed."))


def test_a_fatal_error_is_sent_to_the_run_as_a_worker_error(r, redis_server):
    r.set(keys.ACTIVE_RUN, "doomed")
    with pytest.raises(ValueError, match="model is gone"):
        serve("learner", settings(redis_server), lambda _channels: Scripted([ValueError("model is gone")]))
    events = [e for _, e in Stream(r, keys.RunKeys("doomed").events_of("learner")).read_after("0", pb.Event)]
    assert len(events) == 1 and events[0].worker_error.service == "learner" and "model is gone" in events[0].worker_error.message
    assert events[0].source == "w-0" and events[0].run_id == "doomed"


@pytest.mark.parametrize(
    "outage",
    [redis.ConnectionError("Connection closed by server."), redis.BusyLoadingError("Redis is loading the dataset in memory"),
     redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
     redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'."),
     redis.WatchError("A ConnectionError occurred while watching one or more keys")],  # redis-py's word for a connection lost under WATCH
)
def test_a_redis_outage_or_refusal_re_attaches_the_worker(r, redis_server, outage):
    assert is_retryable(outage)
    r.set(keys.ACTIVE_RUN, "lives")
    attached = []

    def attach(channels):
        attached.append(channels.run_id)
        return Scripted([outage] if len(attached) == 1 else ["stop"])

    assert serve("rollout", settings(redis_server), attach) == 0
    assert attached == ["lives", "lives"]  # detached on the outage, attached again after it
    assert r.xlen(keys.RunKeys("lives").events_of("rollout")) == 0  # an outage is not a worker error


def test_a_worker_restart_re_attaches_without_failing_the_run(r, redis_server):
    """The rollout worker's vLLM server died (VllmServerDied is a WorkerRestart): the worker is
    closed and attached again, and the run hears of no worker error."""
    from magic.rollout.vllm_engine import VllmServerDied
    from magic.runtime.service import WorkerRestart

    assert issubclass(VllmServerDied, WorkerRestart)
    r.set(keys.ACTIVE_RUN, "lives")
    attached, closed = [], []

    class Closing(Scripted):
        def close(self) -> None:
            closed.append(True)

    def attach(channels):
        attached.append(channels.run_id)
        return Closing([VllmServerDied("the vLLM server (pid 1) exited with code -9")] if len(attached) == 1 else ["stop"])

    assert serve("rollout", settings(redis_server), attach) == 0
    assert attached == ["lives", "lives"] and len(closed) == 2
    assert r.xlen(keys.RunKeys("lives").events_of("rollout")) == 0


def test_a_frozen_main_loop_fails_livez_and_stops_the_heartbeat_until_it_moves_again(r, redis_server):
    """The loop is frozen inside a poll (as a learner blocked in a broadcast): /livez turns 503
    after liveness_stall_seconds and the worker's heartbeat key expires, while the HTTP thread and
    the heartbeat thread themselves are fine; thawed, both come back."""
    import threading
    import time

    import httpx

    from magic.runtime.ports import free_port

    port = free_port()
    frozen, thawed, done = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, object] = {}
    r.set(keys.ACTIVE_RUN, "hangs")
    hb_key = keys.heartbeat("rollout", "w-0")

    class Freezing(Worker):
        def poll(self) -> None:
            if not frozen.is_set():
                frozen.set()
                thawed.wait(30)
            elif done.is_set():
                os.kill(os.getpid(), signal.SIGTERM)
            else:
                time.sleep(0.05)

    def livez() -> httpx.Response:
        return httpx.get(f"http://127.0.0.1:{port}/livez", timeout=5)

    def observe() -> None:
        try:
            frozen.wait(30)
            seen["frozen_at_first"] = (livez().status_code, r.exists(hb_key))
            deadline = time.monotonic() + 10
            while livez().status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            seen["hung"] = livez().text
            time.sleep(1.0)  # > the heartbeat's ttl
            seen["heartbeat_while_hung"] = r.exists(hb_key)
            thawed.set()
            deadline = time.monotonic() + 10
            while livez().status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
            seen["after"] = (livez().status_code, r.exists(hb_key))
        finally:
            thawed.set()
            done.set()

    watcher = threading.Thread(target=observe, daemon=True)
    watcher.start()
    s = ServiceSettings(redis_url=redis_server.url, worker_name="w-0", heartbeat_seconds=0.1, heartbeat_ttl_seconds=0.5,
                        liveness_stall_seconds=1.0, metrics_port=port)
    assert serve("rollout", s, lambda _channels: Freezing()) == 0
    watcher.join(5)
    assert seen["frozen_at_first"] == (200, 1)
    assert seen["hung"].startswith("hung: the main loop has made no progress for ") and "(limit 1 s)" in seen["hung"]
    assert seen["heartbeat_while_hung"] == 0  # a hung worker is not a live worker
    assert seen["after"] == (200, 1)
