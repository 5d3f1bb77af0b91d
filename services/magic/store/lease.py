"""The run lease: one controller drives a run at a time.

The lease is a Redis key holding the driving controller's id, with a TTL the driver renews from
its loop (every third of the TTL). A second controller (a rolling update, a restarted pod next
to one that is only slow) waits until the key expires; a driver that finds its lease taken stops
driving at once and leaves the run's state as it is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from magic.protocol import keys
from magic.store.client import is_retryable

log = logging.getLogger(__name__)

_RENEW = """
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
if not holder then redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class RunLease:
    def __init__(self, r: redis.Redis, run_id: str, holder: str, ttl_seconds: float):
        self.r = r
        self.run_id = run_id
        self.key = keys.RunKeys(run_id).lease
        self.holder = holder
        self._ttl_ms = int(ttl_seconds * 1000)
        self._renewed = 0.0

    def acquire(self, shutdown: threading.Event, given_up: Callable[[], bool]) -> bool:
        """Wait until this holder has the lease (True), or `shutdown` is set or `given_up()` says
        the run needs no driver any more (False)."""
        logged = False
        while not shutdown.is_set():
            try:
                if self.r.set(self.key, self.holder, nx=True, px=self._ttl_ms):
                    self._renewed = time.monotonic()
                    return True
                if given_up():
                    return False
                if not logged:
                    holder = self.r.get(self.key)
                    log.warning("run %s is driven by %s; waiting for its lease to expire", self.run_id, holder.decode() if holder else "?")
                    logged = True
            except redis.RedisError as exc:
                if not is_retryable(exc):
                    raise
                log.warning("run %s: Redis unavailable (%s)", self.run_id, exc)
            shutdown.wait(0.2)
        return False

    def renew(self) -> bool:
        """Extend the lease if a third of its TTL has passed; False if another holder has it."""
        now = time.monotonic()
        if now - self._renewed < self._ttl_ms / 3000:
            return True
        if not self.r.eval(_RENEW, 1, self.key, self.holder, self._ttl_ms):
            return False
        self._renewed = now
        return True

    def release(self) -> None:
        """Give the lease up if this holder still has it (best effort: it expires anyway)."""
        try:
            self.r.eval(_RELEASE, 1, self.key, self.holder)
        except redis.RedisError:
            pass
