"""The process skeleton every worker service shares (rollout, reward, learner).

    wait for an active run -> attach a worker to it -> poll until the run ends or we are told to stop

A `Worker` attaches to one run (creates its consumer groups, loads what it needs) and then has
`poll()` called in a loop; each call blocks for at most about a second, so SIGTERM and the end of
the run are noticed promptly. The runtime owns the Redis connection, the heartbeat, the
/metrics endpoint and signal handling; workers never reach back into it.
"""

from __future__ import annotations

import abc
import logging
import signal
import threading
from collections.abc import Callable

import redis

from magic.common import keys
from magic.common.config import ServiceSettings
from magic.common.heartbeat import Heartbeat
from magic.common.logs import setup_logging
from magic.common.metrics import declare_service, serve_http

log = logging.getLogger(__name__)


class Worker(abc.ABC):
    """A service's work for one run."""

    @abc.abstractmethod
    def poll(self) -> None:
        """Do one bounded unit of work (block at most ~1 s waiting for input)."""

    def status(self) -> dict:
        """Shown in the heartbeat (and so in the controller's status)."""
        return {}

    def close(self) -> None:
        """Release what attach took."""


def connect(settings: ServiceSettings) -> redis.Redis:
    return redis.Redis.from_url(settings.redis_url, health_check_interval=30, socket_keepalive=True)


def active_run(r: redis.Redis) -> str | None:
    raw = r.get(keys.ACTIVE_RUN)
    return raw.decode() if raw else None


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
    r.ping()
    worker: Worker | None = None
    run_id: str | None = None
    attaching = threading.Event()

    def ready() -> bool:
        """Ready = Redis answers and we are not busy attaching (loading a model); an idle worker
        with no active run is ready to take one."""
        if attaching.is_set():
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
        serve_http(settings.metrics_port, ready)
    log.info("%s %s up (redis %s)", service, settings.worker_name, settings.redis_url)
    try:
        while not stop.is_set():
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
    finally:
        if worker is not None:
            worker.close()
        heartbeat.stop()
        log.info("%s %s stopped", service, settings.worker_name)
    return 0
