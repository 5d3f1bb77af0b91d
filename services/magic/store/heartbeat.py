"""Worker liveness: each process refreshes a key with a TTL; an expired key means a dead worker.

The controller counts live workers for the step barrier and status; consumers reclaim stream
entries left pending by workers that are no longer alive.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

import redis

from magic.protocol import keys

log = logging.getLogger(__name__)


def alive_workers(r: redis.Redis, service: str, run_id: str | None = None) -> dict[str, dict]:
    """Live workers of `service` (attached to run `run_id`, if given): name -> the status blob of
    its last heartbeat."""
    out: dict[str, dict] = {}
    prefix = keys.heartbeat(service, "")
    for key in r.scan_iter(match=keys.heartbeat_pattern(service), count=1000):
        name = key.decode()[len(prefix):]
        raw = r.get(key)
        if raw is None:
            continue
        try:
            out[name] = json.loads(raw)
        except ValueError:
            out[name] = {}
    if run_id is not None:
        return {n: s for n, s in out.items() if s.get("run") == run_id}
    return out


class Heartbeat:
    """Refreshes `magic:hb:<service>:<worker>` every `interval` seconds from a daemon thread.

    `status` is called at each beat; what it returns is stored as the key's JSON value (the
    controller shows it in run status). The key expires `ttl` seconds after the last beat, so a
    killed process disappears on its own — and so does a hung one: no beat while `stalled()`
    says why the process's main loop is stuck (`magic.runtime.liveness`).
    """

    def __init__(
        self,
        r: redis.Redis,
        service: str,
        worker: str,
        interval: float,
        ttl: float,
        status: Callable[[], dict] | None = None,
        stalled: Callable[[], str | None] = lambda: None,
    ):
        self.r = r
        self.key = keys.heartbeat(service, worker)
        self.interval = interval
        self.ttl_ms = int(ttl * 1000)
        self.status = status or (lambda: {})
        self.stalled = stalled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{service}", daemon=True)

    def beat(self) -> None:
        blob = {"at": time.time(), **self.status()}
        self.r.set(self.key, json.dumps(blob), px=self.ttl_ms)

    def start(self) -> "Heartbeat":
        self.beat()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        try:
            self.r.delete(self.key)
        except redis.RedisError:
            pass

    def _run(self) -> None:
        silent = False
        while not self._stop.wait(self.interval):
            why = self.stalled()
            if why is not None:
                if not silent:
                    log.error("heartbeat stopped: %s", why)
                silent = True
                continue
            if silent:
                log.warning("heartbeat resumed: the main loop made progress again")
                silent = False
            try:
                self.beat()
            except redis.RedisError as exc:  # keep beating once Redis is back
                log.warning("heartbeat failed: %s", exc)
