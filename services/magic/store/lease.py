"""Leases with fencing epochs: one writer per role and run, and a writer that lost its lease
cannot write at all.

A lease is the key `magic:{<run>}:lease:<role>` (role "controller": the step driver; "learner":
the committing learner) holding `"<holder> <epoch>"` with a TTL its holder renews. Every
acquisition takes a new epoch (INCR of `magic:{<run>}:epoch:<role>`), so no two holders, nor one
holder before and after losing its lease, ever share a token.

Every write made under the lease goes through `Lease.transaction()` — a MULTI/EXEC that WATCHes
the lease key and is sent only after reading that the key still holds this holder's token.
Redis aborts the EXEC if the key changed in between: taken by another holder, released, or
expired (Redis >= 6.0.9 aborts on the expiry of a watched key). A writer paused past its lease
(SIGSTOP, a GC pause, a network partition) and resumed therefore writes nothing: its next write
raises `LeaseLost`, and so does `renew`. A lease is never taken back under an old epoch: `renew`
extends only the holder's own key; a lease that expired or was released must be acquired again,
with a new epoch, after which the holder re-reads the run from Redis. An ended run (finished,
failed, stopped) refuses every acquisition, so a stale controller cannot revive it.

The same transaction checks that Redis has not lost writes: it increments its role's write
counter (`magic:{<run>}:seq` for the controller, `magic:{<run>}:seq:learner` for the learner:
each role's ACL user may change only its own, and only by INCR), and refuses to write
(`RedisLostData`) when its own counter or its peer's is below the highest value this holder has
seen — Redis restarted from an AOF missing its last second, from an older snapshot, or empty.
`check()` does the same without writing, for holders that wait. A counter only ever grows while
Redis keeps what it acknowledged, so "Redis lost data" is reported only when a counter says so.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from magic.protocol import keys
from magic.protocol.status import TERMINAL
from magic.store.client import is_retryable, refusals_not_retried

log = logging.getLogger(__name__)

CONTROLLER = "controller"
LEARNER = "learner"
PEER = {CONTROLLER: LEARNER, LEARNER: CONTROLLER}
"""Whose write counter a lease holder checks beside its own."""

_ACQUIRE = """
if redis.call('exists', KEYS[1]) == 1 then return 0 end
local status = redis.call('hget', ARGV[3], 'status')
for i = 4, #ARGV do if status == ARGV[i] then return -1 end end
local epoch = redis.call('incr', KEYS[2])
redis.call('set', KEYS[1], ARGV[1] .. ' ' .. epoch, 'PX', ARGV[2])
return epoch
"""
_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


ENDED = frozenset(s.value for s in TERMINAL)


class LeaseLost(RuntimeError):
    """This holder no longer holds the lease (taken, released or expired): it must not write."""


class RunEnded(RuntimeError):
    """The run has ended: its lease is never granted again."""


class RedisLostData(RuntimeError):
    """Redis holds less than this process has seen written: it restarted from an older state."""


class Lease:
    def __init__(self, r: redis.Redis, run_id: str, role: str, holder: str, ttl_seconds: float):
        if " " in holder:
            raise ValueError(f"a lease holder has no spaces: {holder!r}")
        self.r = r
        self.run_id = run_id
        self.role = role
        self.holder = holder
        self.keys = keys.RunKeys(run_id)
        self.key = self.keys.lease(role)
        self._ttl_ms = int(ttl_seconds * 1000)
        self.epoch: int | None = None
        self.counter_key = self.keys.seq(role)
        self.peer_key = self.keys.seq(PEER[role]) if role in PEER else None
        self.seen = 0
        """The highest value of its own write counter this holder has seen (`RedisLostData` below it)."""
        self.seen_peer = 0
        """The same of the peer role's counter (the learner's for the controller, and back)."""
        self._renewed = 0.0
        self._lock = threading.RLock()  # a renewal never lands between a transaction's WATCH and EXEC

    @property
    def token(self) -> str:
        return f"{self.holder} {self.epoch}"

    # -- holding -------------------------------------------------------------------------------

    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it (a new epoch); RunEnded if the run has ended."""
        # the run's state is read (never written) by the script: an argument, not a key, so that a
        # holder whose ACL user may only read it (the learner, `magic.store.acl`) can run it
        args = (self.holder, self._ttl_ms, self.keys.state, *sorted(ENDED))
        got = int(self.r.eval(_ACQUIRE, 2, self.key, self.keys.epoch(self.role), *args))
        if got == -1:
            raise RunEnded(f"run {self.run_id} has ended")
        if got == 0:
            return False
        self.epoch = got
        self._renewed = time.monotonic()
        self.check()  # a holder that saw more than Redis holds learns it now (RedisLostData)
        log.info("run %s: %s %s holds the %s lease, epoch %d", self.run_id, self.role, self.holder, self.role, got)
        return True

    def acquire(self, shutdown: threading.Event, given_up: Callable[[], bool] = lambda: False) -> bool:
        """Wait until this holder has the lease (True), or `shutdown` is set, `given_up()` says the
        run needs no holder any more or the run has ended (False)."""
        logged = False
        while not shutdown.is_set():
            try:
                if self.try_acquire():
                    return True
                if given_up():
                    return False
                if not logged:
                    log.warning("run %s: the %s lease is held by %s; waiting for it", self.run_id, self.role, self.holder_now() or "?")
                    logged = True
            except RunEnded:
                return False
            except redis.RedisError as exc:
                if not is_retryable(exc):
                    raise
                log.warning("run %s: Redis unavailable (%s)", self.run_id, exc)
            shutdown.wait(0.2)
        return False

    def holder_now(self) -> str | None:
        raw = self.r.get(self.key)
        return raw.decode() if raw else None

    def held(self) -> bool:
        return self.epoch is not None and self.r.get(self.key) == self.token.encode()

    def ensure_held(self) -> None:
        """LeaseLost unless this holder holds the lease now (and RedisLostData if Redis lost
        writes): the fence of a write made outside Redis (a checkpoint's rename), checked just
        before it."""
        if not self.held():
            self.epoch = None
            raise LeaseLost(f"run {self.run_id}: {self.holder} no longer holds the {self.role} lease (now {self.holder_now() or 'nobody'})")
        self.check()

    def renew(self, force: bool = False) -> bool:
        """Extend the lease if a third of its TTL has passed (or `force`); False if this holder
        lost it (the lease is then never taken back under this epoch)."""
        if self.epoch is None:
            return False
        now = time.monotonic()
        if not force and now - self._renewed < self._ttl_ms / 3000:
            return True
        with self._lock:
            if self.epoch is None or not self.r.eval(_RENEW, 1, self.key, self.token, self._ttl_ms):
                self.epoch = None
                return False
        self._renewed = now
        return True

    def release(self) -> None:
        """Give the lease up if this holder still has it (best effort: it expires anyway)."""
        if self.epoch is None:
            return
        try:
            self.r.eval(_RELEASE, 1, self.key, self.token)
        except redis.RedisError:
            pass
        self.epoch = None

    def keep(self, interval: float | None = None) -> "Lease":
        """Renew the lease from a daemon thread every `interval` seconds (a third of the TTL) for a
        holder whose loop blocks longer than the TTL (the learner trains for minutes). A SIGSTOP
        stops the thread too, so the lease still expires; once a renewal fails, `epoch` is None
        and the holder's next write raises LeaseLost."""
        self._stop_keeping = threading.Event()
        period = interval or self._ttl_ms / 3000

        def run() -> None:
            while not self._stop_keeping.wait(period):
                try:
                    if not self.renew(force=True):
                        log.error("run %s: the %s lease of %s was lost", self.run_id, self.role, self.holder)
                        return
                except redis.RedisError as exc:
                    log.warning("run %s: renewing the %s lease failed (%s)", self.run_id, self.role, exc)

        threading.Thread(target=run, name=f"lease-{self.role}", daemon=True).start()
        return self

    def stop_keeping(self) -> None:
        if getattr(self, "_stop_keeping", None) is not None:
            self._stop_keeping.set()

    # -- writing under the lease --------------------------------------------------------------

    def counter(self) -> int:
        """This role's write counter as Redis holds it now."""
        return _int(self.r.get(self.counter_key))

    def counters(self, r: redis.Redis | redis.client.Pipeline | None = None) -> tuple[int, int]:
        """(own counter, peer's counter) as Redis holds them now (two GETs: each role's ACL user
        may read the counters one key at a time)."""
        r = r or self.r
        return _int(r.get(self.counter_key)), _int(r.get(self.peer_key)) if self.peer_key else 0

    def accept_loss(self) -> None:
        """Take Redis's write counters as they are now (after reporting that Redis lost data), so
        the holder can record the run's failure."""
        with self._lock:
            self.seen, self.seen_peer = self.counters()

    def check(self) -> int:
        """RedisLostData if the run's write counter is below what this holder has seen."""
        with self._lock:  # read and compare with no write of another thread (retention) in between
            return self._check()

    def _check(self, now: tuple[int, int] | None = None) -> int:
        own, peer = now or self.counters()
        for key, value, seen in ((self.counter_key, own, self.seen), (self.peer_key, peer, self.seen_peer)):
            if value < seen:
                raise RedisLostData(
                    f"Redis lost writes of run {self.run_id}: its write counter {key.rsplit('}:', 1)[-1]} is {value}, this {self.role} saw {seen} "
                    "(Redis restarted from an older state: an AOF missing its last writes, an older snapshot, or empty)"
                )
        self.seen, self.seen_peer = own, peer
        return own

    @contextmanager
    def transaction(self) -> Iterator[redis.client.Pipeline]:
        """A MULTI/EXEC of writes made under the lease: queue them on the yielded pipeline; it is
        executed when the block ends only if this holder still holds the lease, the run has not
        ended and Redis has lost nothing — else LeaseLost / RunEnded / RedisLostData and nothing is
        written. Discarded if the block raises. The replies are left in `pipe.replies`."""
        if self.epoch is None:
            raise LeaseLost(f"run {self.run_id}: {self.holder} does not hold the {self.role} lease")
        with self._lock, self.r.pipeline(transaction=True) as pipe:
            pipe.watch(self.key)
            if pipe.get(self.key) != self.token.encode():
                self.epoch = None
                raise LeaseLost(f"run {self.run_id}: the {self.role} lease of {self.holder} was lost (now {self.holder_now() or 'nobody'})")
            status = pipe.hget(self.keys.state, "status")
            if status is not None and status.decode() in ENDED:
                raise RunEnded(f"run {self.run_id} has ended ({status.decode()}): it is never changed again")
            own, peer = self.counters(pipe)
            if own < self.seen or peer < self.seen_peer:
                self._check((own, peer))
            self.seen_peer = peer
            pipe.multi()
            yield pipe
            pipe.execute_command("INCR", self.counter_key)  # INCR, not INCRBY: the roles' ACL users may only count up by one
            try:
                with refusals_not_retried():  # refused at maxmemory: retried whole by the caller, checks included
                    replies = pipe.execute()
            except redis.WatchError:
                now = self.holder_now()
                if now == self.token:  # still ours: the connection broke during EXEC (redis-py reports WatchError)
                    raise redis.ConnectionError(f"run {self.run_id}: the connection broke during a fenced write; re-read the run") from None
                self.epoch = None
                raise LeaseLost(f"run {self.run_id}: the {self.role} lease of {self.holder} changed during a write (now {now or 'nobody'})") from None
            self.seen = max(self.seen, int(replies[-1]))
            pipe.replies = replies[:-1]


class Direct:
    """Writes made without a lease (rollout and reward workers, the API): the same transactions as
    `Lease.transaction`, unconditional."""

    def __init__(self, r: redis.Redis):
        self.r = r

    @contextmanager
    def transaction(self) -> Iterator[redis.client.Pipeline]:
        with self.r.pipeline(transaction=True) as pipe:
            yield pipe
            pipe.replies = pipe.execute()


Writer = Lease | Direct


def _int(raw: bytes | None) -> int:
    return int(raw) if raw else 0
"""Who writes: a lease holder (fenced) or a process without a lease."""
