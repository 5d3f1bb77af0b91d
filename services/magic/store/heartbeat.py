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


HEARTBEAT_TTL = 10.0
"""Seconds a heartbeat stays valid unless the settings say otherwise (`ServiceSettings.heartbeat_ttl_seconds`)."""
CLOCK_SKEW = 30.0
"""Seconds a heartbeat's own timestamp may differ from the reader's clock (pods' clocks disagree a
little; a pod's clock further off makes its worker count as dead, logged with the offset). A
heartbeat written once and never refreshed counts for at most `max_age` + twice this."""

_refused: set[str] = set()


def alive_workers(r: redis.Redis, service: str, run_id: str | None = None, max_age: float = HEARTBEAT_TTL) -> dict[str, dict]:
    """Live workers of `service` (attached to run `run_id`, if given): name -> the status blob of
    its last heartbeat.

    A heartbeat counts only while its key has an expiry and its own timestamp `at` is no older than
    `max_age` (nor newer than now, give or take `CLOCK_SKEW`): a key written without expiry, or once
    and never refreshed, by a process holding the service's credentials is no live worker."""
    out: dict[str, dict] = {}
    prefix = keys.heartbeat(service, "")
    found = list(r.scan_iter(match=keys.heartbeat_pattern(service), count=1000))
    if not found:
        return out
    pipe = r.pipeline(transaction=False)
    for key in found:
        pipe.get(key)
        pipe.pttl(key)
    replies = pipe.execute()
    now = time.time()
    for i, key in enumerate(found):
        name, raw, ttl_ms = key.decode()[len(prefix):], replies[2 * i], replies[2 * i + 1]
        if raw is None:
            continue
        try:
            status = json.loads(raw)
            at = float(status["at"])
        except (ValueError, TypeError, KeyError):
            _refuse(key, "not a heartbeat (no JSON object with a timestamp)")
            continue
        if ttl_ms is None or ttl_ms < 0:
            _refuse(key, "it has no expiry")
            continue
        if not now - max_age - CLOCK_SKEW <= at <= now + CLOCK_SKEW:
            _refuse(key, f"its timestamp is {now - at:.0f}s off (a heartbeat is fresh for {max_age:.0f}s)")
            continue
        out[name] = status
    if run_id is not None:
        return {n: s for n, s in out.items() if s.get("run") == run_id}
    return out


def _refuse(key: bytes, why: str) -> None:
    """Log a heartbeat that does not count, once per key."""
    name = key.decode(errors="replace")
    if name not in _refused:
        if len(_refused) > 10_000:  # bounded, whatever a hostile writer creates
            _refused.clear()
        _refused.add(name)
        log.warning("heartbeat %s is no live worker: %s", name, why)


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
