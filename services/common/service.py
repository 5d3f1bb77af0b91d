"""The process skeleton every worker service shares (rollout, reward, learner).

    wait for an active run -> attach a worker to it -> poll until the run ends or we are told to stop

A `Worker` attaches to one run (creates its consumer groups, loads what it needs) and then has
`poll()` called in a loop; each call blocks for at most about a second, so SIGTERM and the end of
the run are noticed promptly. The runtime owns the Redis connection, the heartbeat, the
/metrics endpoint and signal handling; workers never reach back into it.

Faults. A retryable Redis error (`magic.common.bus.RETRYABLE`: Redis restarting or loading its
AOF, a refusal at `maxmemory`) detaches the worker and re-attaches it once Redis answers again,
so its state is rebuilt from what Redis holds (which may have lost the last second of writes).
Any other error is fatal: the runtime sends a WorkerError for the run on `events` — the
controller fails the run at once with the reason — and the process exits non-zero.
"""

from __future__ import annotations

import abc
import logging
import signal
import threading
import time
from collections.abc import Callable

import redis

from magic.common import codec, keys
from magic.common.bus import is_retryable
from magic.common.config import ServiceSettings
from magic.common.heartbeat import Heartbeat
from magic.common.logs import redact_url, setup_logging
from magic.common.metrics import declare_service, registry_of, serve_http

log = logging.getLogger(__name__)


class Worker(abc.ABC):
    """A service's work for one run."""

    @abc.abstractmethod
    def poll(self) -> None:
        """Do one bounded unit of work (block at most ~1 s waiting for input)."""

    def status(self) -> dict:
        """Shown in the heartbeat (and so in the controller's status)."""
        return {}

    def problem(self) -> str | None:
        """Why the worker cannot do its work now (reported by /readyz), or None."""
        return None

    def close(self) -> None:
        """Release what attach took."""


def connect(settings: ServiceSettings) -> redis.Redis:
    from magic.common.refusals import client

    return client(settings.redis_url, health_check_interval=30, socket_keepalive=True)


def active_run(r: redis.Redis) -> str | None:
    raw = r.get(keys.ACTIVE_RUN)
    return raw.decode() if raw else None


def _wait_for_redis(r: redis.Redis, stop: threading.Event) -> None:
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


class WorkerRestart(RuntimeError):
    """Something the worker depends on besides Redis is gone (the rollout worker's vLLM server):
    `serve` closes the worker and attaches a new one, as after a lost Redis connection, instead of
    failing the run. Its unacknowledged entries are re-read by the new one (same consumer name)."""


def report_fatal(r: redis.Redis, run_id: str, service: str, worker_name: str, exc: BaseException) -> None:
    """Tell the run's controller that this worker cannot go on (a WorkerError on `events`)."""
    from magic.common.pb import messages_pb2 as pb

    message = f"{type(exc).__name__}: {exc}"[:4000]
    try:
        r.xadd(keys.RunKeys(run_id).events, codec.encode(pb.Event(run_id=run_id, at=time.time(), source=worker_name, worker_error=pb.WorkerError(service=service, message=message))))
    except redis.RedisError:
        log.exception("cannot report the fatal error to run %s", run_id)


def serve(service: str, settings: ServiceSettings, attach: Callable[[redis.Redis, str], Worker]) -> int:
    """Run `service` until SIGTERM/SIGINT: attach to each active run in turn and poll it."""
    setup_logging(service, settings.worker_name, settings.log_level)
    if settings.torch_threads:
        import torch

        torch.set_num_threads(settings.torch_threads)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    r = connect(settings)
    _wait_for_redis(r, stop)
    worker: Worker | None = None
    run_id: str | None = None
    attaching = threading.Event()

    def ready() -> bool:
        """Ready = Redis answers and we are not busy attaching (loading a model); an idle worker
        with no active run is ready to take one."""
        if attaching.is_set():
            return False
        if worker is not None and worker.problem():
            return False
        try:
            return bool(r.ping())
        except redis.RedisError:
            return False

    def status() -> dict:
        return {"run": run_id, **(worker.status() if worker else {})}

    heartbeat = Heartbeat(r, service, settings.worker_name, settings.heartbeat_seconds, settings.heartbeat_ttl_seconds, status).start()
    declare_service(service)
    if settings.metrics_port is not None:
        serve_http(settings.metrics_port, ready, registry=registry_of(service))
    log.info("%s %s up (redis %s)", service, settings.worker_name, redact_url(settings.redis_url))
    backoff = 0.5
    try:
        while not stop.is_set():
            try:
                current = active_run(r)
                if current != run_id and worker is not None:
                    log.info("run %s ended; detaching", run_id)
                    worker.close()
                    worker, run_id = None, None
                if current is None:
                    stop.wait(0.5)
                    continue
                if worker is None:
                    run_id = current
                    log.info("attaching to run %s", run_id)
                    attaching.set()
                    try:
                        worker = attach(r, run_id)
                    finally:
                        attaching.clear()
                worker.poll()
                backoff = 0.5
            except WorkerRestart as exc:
                log.error("%s %s: %s; detaching, attaching again in %.1fs", service, settings.worker_name, exc, backoff)
                worker, run_id = _detach(worker), None
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception as exc:
                if not is_retryable(exc):
                    log.exception("%s %s: fatal error", service, settings.worker_name)
                    if run_id is not None:
                        report_fatal(r, run_id, service, settings.worker_name, exc)
                    raise
                log.warning("Redis unavailable (%s: %s); detaching, retrying in %.1fs", type(exc).__name__, exc, backoff)
                worker, run_id = _detach(worker), None
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
    finally:
        if worker is not None:
            worker.close()
        heartbeat.stop()
        log.info("%s %s stopped", service, settings.worker_name)
    return 0


def _detach(worker: Worker | None) -> None:
    """Close `worker` after a lost connection (its own cleanup may fail the same way)."""
    if worker is not None:
        try:
            worker.close()
        except Exception:  # noqa: BLE001 — best effort: the worker is rebuilt from Redis
            log.exception("closing the worker after a lost connection failed")
    return None
