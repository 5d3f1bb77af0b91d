"""The process skeleton every worker service shares (rollout, reward, learner).

    wait for an active run -> attach a worker to it -> poll until the run ends or we are told to stop

A `Worker` attaches to one run (creates its consumer groups, loads what it needs) and then has
`poll()` called in a loop; each call blocks for at most about a second, so SIGTERM and the end of
the run are noticed promptly. The runtime owns the Redis connection, the heartbeat, the
/metrics endpoint and signal handling; workers never reach back into it.

Liveness. The loop beats a `LoopWatch` each time it comes round (attaching may take up to
`attach_timeout_seconds`); /livez fails and the Redis heartbeat stops once it has not come round
for `liveness_stall_seconds` — a poll that never returns is a hung process
(`magic.runtime.liveness`).

Faults. A retryable Redis error (`magic.store.client.RETRYABLE`: Redis restarting or loading its
AOF, a refusal at `maxmemory`) detaches the worker and re-attaches it once Redis answers again,
so its state is rebuilt from what Redis holds (which may have lost the last second of writes).
Any other error is fatal: the runtime sends a WorkerError for the run on its role's event stream
(the learner's fails the run at once with the reason; a rollout or reward worker's once no other
worker of its service is live) and the process exits non-zero. A write Redis refuses to the role's
ACL user (NOPERM) is logged with the role and the refusal, then handled the same way.
"""

from __future__ import annotations

import abc
import importlib.util
import logging
import signal
import threading
from collections.abc import Callable

from magic.config.settings import ServiceSettings
from magic.observability.logs import redact_url, setup_logging
from magic.observability.metrics import declare_service, registry_of, serve_http
from magic.runtime.liveness import LoopWatch
from magic.store.channels import RunChannels
from magic.store.client import NoPermission, answers, connect, is_retryable, run_gone, wait_for_redis
from magic.store.heartbeat import Heartbeat
from magic.store.lease import LeaseLost, RunEnded
from magic.store.runs import active_run

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


class WorkerRestart(RuntimeError):
    """Something the worker depends on besides Redis is gone (the rollout worker's vLLM server), or
    it cannot work now (a learner standing by while another holds the run's learner lease):
    `serve` closes the worker and attaches a new one, as after a lost Redis connection, instead of
    failing the run (so does a lost lease, `magic.store.lease.LeaseLost`). Its unacknowledged
    entries are re-read by the new one (same consumer name)."""


def serve(service: str, settings: ServiceSettings, attach: Callable[[RunChannels], Worker], watch: LoopWatch | None = None) -> int:
    """Run `service` until SIGTERM/SIGINT: attach to each active run in turn and poll it. `attach`
    builds the service's worker over the run's channels. `watch`: the process's liveness, when its
    endpoint is served elsewhere (the reward service's); else one from the settings."""
    setup_logging(service, settings.worker_name, settings.log_level)
    if settings.torch_threads and importlib.util.find_spec("torch") is not None:
        import torch  # heavy, and only in the images of the services that compute with it

        torch.set_num_threads(settings.torch_threads)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    r = connect(settings.redis_url)
    wait_for_redis(r, stop)
    worker: Worker | None = None
    run_id: str | None = None
    channels: RunChannels | None = None
    attaching = threading.Event()

    def ready() -> bool:
        """Ready = Redis answers and we are not busy attaching (loading a model); an idle worker
        with no active run is ready to take one."""
        if attaching.is_set():
            return False
        if worker is not None and worker.problem():
            return False
        return answers(r)

    def status() -> dict:
        return {"run": run_id, **(worker.status() if worker else {})}

    watch = watch or LoopWatch(settings.liveness_stall_seconds)
    heartbeat = Heartbeat(r, service, settings.worker_name, settings.heartbeat_seconds, settings.heartbeat_ttl_seconds, status, watch.stalled).start()
    declare_service(service)
    if settings.metrics_port is not None:
        serve_http(settings.metrics_port, ready, registry=registry_of(service), stalled=watch.stalled)
    log.info("%s %s up (redis %s)", service, settings.worker_name, redact_url(settings.redis_url))
    backoff = 0.5
    try:
        while not stop.is_set():
            watch.beat()
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
                    channels = RunChannels(r, run_id, service, settings.worker_name, settings.max_deliveries, heartbeat_ttl=settings.heartbeat_ttl_seconds)
                    log.info("attaching to run %s", run_id)
                    attaching.set()
                    try:
                        with watch.allowing(settings.attach_timeout_seconds, f"attaching to run {run_id}"):
                            worker = attach(channels)
                    finally:
                        attaching.clear()
                worker.poll()
                backoff = 0.5
            except (WorkerRestart, LeaseLost, RunEnded) as exc:  # RunEnded: a fenced write after the run ended
                log.error("%s %s: %s; detaching, attaching again in %.1fs", service, settings.worker_name, exc, backoff)
                worker, run_id = _detach(worker), None
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception as exc:
                if run_gone(exc):  # Redis lost the run (restarted empty): the controller decides; nothing to report to
                    log.error("%s %s: the run's streams are gone from Redis (%s); detaching", service, settings.worker_name, exc)
                    worker, run_id = _detach(worker), None
                    stop.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                if not is_retryable(exc):
                    if isinstance(exc, NoPermission):
                        log.error("%s %s: Redis refused a command to role %s's ACL user: %s", service, settings.worker_name, service, exc)
                    log.exception("%s %s: fatal error", service, settings.worker_name)
                    if channels is not None and run_id is not None:
                        channels.report_fatal(service, exc)
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
