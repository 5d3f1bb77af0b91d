"""The Redis client every process uses, and the Redis errors a process waits out.

`connect(url)` is the one way to a Redis connection: a standalone Redis (`redis://`, `rediss://`)
or the master a set of Redis Sentinels names (`redis+sentinel://`, `SentinelURL`). `RETRYABLE` / `is_retryable` name the errors
after which the same call succeeds once Redis is back (connection lost, loading its AOF, refusing
writes at `maxmemory`); the service runtime (`magic.runtime.service`) waits them out and
re-attaches its worker.

A write Redis refuses at `maxmemory` is a retryable fault, not a crash.

Redis runs with `maxmemory` and `maxmemory-policy noeviction` (the chart, the local Redis): when
full it answers a write (XADD, HSET, SET, ...) with `OOM command not allowed when used memory >
'maxmemory'` and executes nothing — a MULTI/EXEC transaction with such a command is discarded
whole (EXECABORT). Deletions (XTRIM, XACK, XDEL, DEL) are never refused, so memory comes back as
consumers acknowledge and the controller trims (`magic.store.retention`).

A refused command therefore did nothing and can be sent again as it is. `retry_refused` does that
with capped exponential backoff for up to `patience` seconds, logging and counting each refusal
(`magic_redis_refused_writes`); past that it raises the last `redis.OutOfMemoryError`, which the
services treat as they treat a lost Redis (the controller resumes from its persisted state, a
worker restarts and recovers its pending entries).

`client()` builds every service's Redis connection with that behaviour under redis-py's own
connection retry, so each command and each pipeline is covered. A non-transactional pipeline is
sent again whole, so it must hold only idempotent writes (all of MAGIC's do: HSET/HSETNX of
per-prompt flags); anything that appends must use a transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import parse_qsl, unquote

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from magic.observability.metrics import REDIS_REFUSED

log = logging.getLogger(__name__)

Redis = redis.Redis
"""The client type (a connection from `connect` / `client`), for annotations outside this layer."""
RedisError = redis.RedisError
"""Every error of the Redis client (services catch it without importing redis)."""

RETRYABLE: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,  # Redis restarting, network partition (includes timeouts' parent)
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,  # Redis is loading its AOF / RDB after a restart
    redis.exceptions.OutOfMemoryError,  # "command not allowed when used memory > 'maxmemory'"
    redis.exceptions.ReadOnlyError,  # a replica promoted / failover in progress
)
"""Redis errors a service waits out (reconnecting) instead of failing: the same call succeeds
once Redis is back or has memory again."""


def is_retryable(exc: BaseException) -> bool:
    """True for `RETRYABLE` errors, also when redis-py reports a refusal as a plain ResponseError,
    or a connection lost under a WATCH as a WatchError ("A ConnectionError occurred while watching
    one or more keys": the transaction never ran, as with any ConnectionError)."""
    if isinstance(exc, RETRYABLE):
        return True
    if isinstance(exc, redis.exceptions.WatchError) and "ConnectionError occurred" in str(exc):
        return True
    return isinstance(exc, redis.ResponseError) and any(
        s in str(exc) for s in ("OOM command not allowed", "LOADING", "MASTERDOWN", "READONLY")
    )

T = TypeVar("T")

PATIENCE_SECONDS = 120.0
"""How long a refused write is retried before the error is raised."""


def is_refused(exc: BaseException) -> bool:
    """True for Redis' answer to a write over `maxmemory` (also inside a discarded transaction)."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return True
    return isinstance(exc, redis.ResponseError) and str(exc).startswith("OOM ")


def backoff_seconds(attempt: int, first: float = 0.05, cap: float = 2.0) -> float:
    """Wait before retry `attempt` (1, 2, ...): first·2^(attempt−1), at most `cap`.

    >>> [backoff_seconds(n) for n in (1, 2, 3, 10)]
    [0.05, 0.1, 0.2, 2.0]
    """
    return min(cap, first * 2 ** (attempt - 1))


_unretried = threading.local()


@contextmanager
def refusals_not_retried() -> Iterator[None]:
    """Inside this block a write Redis refuses at `maxmemory` raises at once, in this thread: a
    transaction conditional on WATCHed keys (a fenced write, `magic.store.lease`) must not be sent
    again as it is — EXEC has unwatched the keys, so the resend would no longer be conditional.
    Its caller retries it whole, checks included."""
    _unretried.depth = getattr(_unretried, "depth", 0) + 1
    try:
        yield
    finally:
        _unretried.depth -= 1


def retry_refused(call: Callable[[], T], *, patience: float = PATIENCE_SECONDS, what: str = "write", sleep: Callable[[float], None] = time.sleep) -> T:
    """`call()`, sent again while Redis refuses it for lack of memory, for up to `patience` seconds
    (except inside `refusals_not_retried`).

    `call` must be safe to repeat after a refusal: a single command or a transaction (refused =
    not executed), or a pipeline of idempotent writes."""
    deadline = time.monotonic() + patience
    attempt = 0
    while True:
        try:
            return call()
        except redis.ResponseError as exc:
            if not is_refused(exc) or getattr(_unretried, "depth", 0):
                raise
            attempt += 1
            REDIS_REFUSED.inc()
            if time.monotonic() >= deadline:
                log.error("Redis still refuses the %s after %.0fs (maxmemory reached): giving up", what, patience)
                raise
            if attempt == 1 or attempt % 20 == 0:
                log.warning("Redis refused the %s (maxmemory reached; attempt %d): retrying until consumers free memory", what, attempt)
            sleep(backoff_seconds(attempt))


class RefusalRetry(Retry):
    """redis-py's connection retry (lost connections, timeouts) around `retry_refused`."""

    def __init__(self, patience: float = PATIENCE_SECONDS, retries: int = 3):
        super().__init__(ExponentialWithJitterBackoff(base=1.0, cap=10.0), retries)
        self.patience = patience

    def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):
        return super().call_with_retry(lambda: retry_refused(do, patience=self.patience, what="command"), fail, is_retryable, with_failure_count)

    def __eq__(self, other):
        return isinstance(other, RefusalRetry) and super().__eq__(other) and self.patience == other.patience

    __hash__ = Retry.__hash__


SENTINEL_SCHEMES = ("redis+sentinel://", "rediss+sentinel://")
SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelURL:
    """`redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master[/db][?sentinel_password=…&sentinel_username=…]`
    (`rediss+sentinel://`: TLS to the master and the sentinels): the sentinels to ask, the name of
    the master they watch, and the master's credentials and database."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    tls: bool = False

    @classmethod
    def parse(cls, url: str) -> SentinelURL:
        scheme = next((s for s in SENTINEL_SCHEMES if url.startswith(s)), None)
        if scheme is None:
            raise ValueError(f"not a Sentinel URL (want {' or '.join(SENTINEL_SCHEMES)}…)")
        rest, _, query = url[len(scheme):].partition("?")
        netloc, _, path = rest.partition("/")
        userinfo, at, hosts = netloc.rpartition("@")
        username = password = None
        if at:
            user, colon, pw = userinfo.partition(":")
            username, password = unquote(user) or None, (unquote(pw) if colon else None)
        sentinels = []
        for hp in hosts.split(","):
            hp = hp.strip()
            if hp.startswith("["):  # an IPv6 address: [addr] or [addr]:port
                addr, _, rest = hp[1:].partition("]")
                host, colon, port = addr, rest[:1], rest[1:]
                if rest and rest[:1] != ":":
                    host = ""
            else:
                host, colon, port = hp.rpartition(":") if ":" in hp else (hp, "", "")
            if not host or (colon and not port.isdigit()):
                raise ValueError(f"Sentinel URL: bad sentinel address {hp!r} (host[:port] or [ipv6][:port], comma-separated)")
            sentinels.append((host, int(port) if colon else SENTINEL_PORT))
        parts = [p for p in path.split("/") if p]
        if not parts or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
            raise ValueError("Sentinel URL: the path must be /<master name>[/<db>]")
        options = dict(parse_qsl(query))
        unknown = set(options) - {"sentinel_username", "sentinel_password"}
        if unknown:
            raise ValueError(f"Sentinel URL: unknown options {sorted(unknown)} (sentinel_username, sentinel_password)")
        return cls(tuple(sentinels), unquote(parts[0]), int(parts[1]) if len(parts) == 2 else 0, username, password,
                   options.get("sentinel_username"), options.get("sentinel_password"), scheme.startswith("rediss"))


def client(url: str, patience: float = PATIENCE_SECONDS, **kwargs) -> redis.Redis:
    """A Redis client whose commands and pipelines wait out refused writes (see module doc).

    A Sentinel URL (`SentinelURL`) gives a client of the master the sentinels name now: after a
    failover its next connection asks them again, and a connection still open to the old master
    (now a replica, answering READONLY) is dropped as a ConnectionError — retryable, so services
    re-attach to the new master. Replication is asynchronous: writes acknowledged by the old
    master may be missing on the new one, which the lease's write counter detects
    (`magic.store.lease.RedisLostData`), as after any loss of writes."""
    if url.startswith(SENTINEL_SCHEMES):
        spec = SentinelURL.parse(url)
        tls = {"ssl": True} if spec.tls else {}
        timeouts = {k: kwargs[k] for k in ("socket_timeout", "socket_connect_timeout") if k in kwargs}
        sentinel = Sentinel(list(spec.sentinels), sentinel_kwargs={"username": spec.sentinel_username, "password": spec.sentinel_password, **tls, **timeouts})
        return sentinel.master_for(spec.master, db=spec.db, username=spec.username, password=spec.password, retry=RefusalRetry(patience), **tls, **kwargs)
    return redis.Redis.from_url(url, retry=RefusalRetry(patience), **kwargs)


NoPermission = redis.exceptions.NoPermissionError
"""Redis refused a command to this process's ACL user (NOPERM: `magic.store.acl`)."""


class RunGone(RuntimeError):
    """A run's spec is not in Redis (the run was never created, or Redis lost it)."""


def run_gone(exc: BaseException) -> bool:
    """True when Redis no longer has a run's consumer group or spec (it restarted empty, or from a
    snapshot older than the run): not a fault of the process that hit it."""
    return isinstance(exc, RunGone) or (isinstance(exc, redis.ResponseError) and str(exc).startswith("NOGROUP"))


def connect(url: str, **kwargs) -> redis.Redis:
    """A service's connection: refused writes retried (`client`), dead connections noticed."""
    return client(url, health_check_interval=30, socket_keepalive=True, **kwargs)


def answers(r: redis.Redis) -> bool:
    """True if Redis answers a PING now (readiness probes)."""
    try:
        return bool(r.ping())
    except redis.RedisError:
        return False


def answers_at(port: int, host: str = "127.0.0.1") -> bool:
    """True if a Redis server at `host`:`port` answers a PING now (a server being started)."""
    with redis.Redis(host=host, port=port, socket_connect_timeout=0.5) as probe:
        return answers(probe)


def wait_for_redis(r: redis.Redis, stop: threading.Event) -> None:
    """Block until Redis answers (a service may start before it, or while it loads its AOF)."""
    delay = 0.2
    while not stop.is_set():
        try:
            r.ping()
            return
        except redis.RedisError as exc:
            if not is_retryable(exc):
                raise
            log.warning("waiting for Redis (%s)", exc)
            stop.wait(delay)
            delay = min(delay * 2, 5.0)
