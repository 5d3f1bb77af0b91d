"""One run's channels, bound to the run: what every service reads and writes of it.

    channels = RunChannels(r, run_id, consumer="rollout-0", max_deliveries=5)
    channels.spec()                              the RunSpec the controller stored
    channels.group("prompts", ROLLOUT_GROUP)     a work queue of the run (dead letters to its `dead`)
    channels.stream("rollouts")                  a stream of the run, to append to or follow
    channels.steps                               the step contract (`magic.store.steps`)
    channels.alive("rollout")                    live workers of a service, with their status
    channels.fenced(lease)                       the same, every write made under a lease

A process that holds a lease of the run (the controller's driver, the committing learner) uses
fenced channels: every write — an acknowledgement, a dead letter, an announcement, a commit — is
refused once the lease is lost (`magic.store.lease`).

The service runtime (`magic.runtime.service`) builds one per attach and hands it to the
service's worker; a worker reaches Redis through it and nothing else. Stream names are the
attributes of `magic.protocol.keys.RunKeys` (`prompts`, `rollouts`, `scored`, `weights`,
`events`, `estimates`, `dead`).
"""

from __future__ import annotations

import logging
import time

import redis
from google.protobuf.message import Message

from magic.config.schema import RunSpec
from magic.protocol import keys
from magic.protocol.pb import messages_pb2 as pb
from magic.store.client import RunGone
from magic.store.heartbeat import alive_workers
from magic.store.lease import Lease
from magic.store.steps import StepStore
from magic.store.streams import ConsumerGroup, Entry, Stream

log = logging.getLogger(__name__)


class RunChannels:
    def __init__(self, r: redis.Redis, run_id: str, consumer: str = "", max_deliveries: int = 5, fence: Lease | None = None):
        self._r = r
        self.run_id = run_id
        self.keys = keys.RunKeys(run_id)
        self.consumer = consumer
        """This process's name as a stream consumer (the worker name)."""
        self.max_deliveries = max_deliveries
        self.fence = fence
        """The lease this process writes under (controller, learner), or None (rollout, reward)."""
        self.steps = StepStore(r, run_id, fence)

    def lease(self, role: str, holder: str, ttl_seconds: float) -> Lease:
        """The run's `role` lease as `holder` would hold it (`magic.store.lease`)."""
        return Lease(self._r, self.run_id, role, holder, ttl_seconds)

    def fenced(self, lease: Lease) -> "RunChannels":
        """The same channels, every write made under `lease`."""
        return RunChannels(self._r, self.run_id, self.consumer, self.max_deliveries, lease)

    def spec(self) -> RunSpec:
        raw = self._r.get(self.keys.spec)
        if raw is None:
            raise RunGone(f"run {self.run_id!r} has no spec in Redis")
        return RunSpec.model_validate_json(raw)

    def stream(self, name: str) -> Stream:
        """The run's stream `name` ("weights", "rollouts", ...)."""
        return Stream(self._r, getattr(self.keys, name), self.fence)

    def group(self, name: str, group: str, consumer: str | None = None) -> ConsumerGroup:
        """This process's consumer of the run's stream `name` in consumer group `group`, created
        if needed (`ensure`); poison goes to the run's dead-letter stream."""
        out = ConsumerGroup(
            self._r, getattr(self.keys, name), group, consumer or self.consumer, dead_stream=self.keys.dead, max_deliveries=self.max_deliveries,
            writer=self.fence,
        )
        out.ensure()
        return out

    def dead_letter_once(self, stream: Stream, entry: Entry, reason: str) -> bool:
        """Record a poison entry of a fan-out stream once in the run's dead-letter stream."""
        return stream.dead_letter_once(entry, reason, self.keys.dead, self.consumer)

    def alive(self, service: str) -> dict[str, dict]:
        """Live workers of `service` attached to this run: name -> last heartbeat's status."""
        return alive_workers(self._r, service, self.run_id)

    def report(self, message: Message) -> None:
        """Send an event of this process on the run's `events` stream (`pb.Event` kinds)."""
        self.stream("events").add(pb.Event(run_id=self.run_id, at=time.time(), source=self.consumer, **{_kind(message): message}))

    def report_fatal(self, service: str, exc: BaseException) -> None:
        """Tell the run's controller that this worker cannot go on (a WorkerError on `events`)."""
        message = f"{type(exc).__name__}: {exc}"[:4000]
        try:
            self.report(pb.WorkerError(service=service, message=message))
        except redis.RedisError:
            log.exception("cannot report the fatal error to run %s", self.run_id)

    def stream_stats(self, names: tuple[str, ...]) -> dict[str, tuple[int, int | None, int | None]]:
        """(length, pending, lag) of each of the run's streams `names`; pending and lag are None for
        a stream without consumer groups, lag None where Redis cannot tell it (after deletions)."""
        return _stream_stats(self._r, self.keys, names)


def _stream_stats(r: redis.Redis, run: keys.RunKeys, names: tuple[str, ...]) -> dict[str, tuple[int, int | None, int | None]]:
    pipe = r.pipeline(transaction=False)
    for name in names:
        key = getattr(run, name)
        pipe.xlen(key)
        pipe.xinfo_groups(key)
    replies = pipe.execute(raise_on_error=False)
    out = {}
    for i, name in enumerate(names):
        length, groups = replies[2 * i], replies[2 * i + 1]
        length = 0 if isinstance(length, Exception) else int(length)
        if isinstance(groups, Exception) or not groups:
            out[name] = (length, None, None)
            continue
        lags = [g.get("lag") for g in groups]
        lag = sum(int(x) for x in lags) if all(x is not None for x in lags) else None
        out[name] = (length, sum(int(g["pending"]) for g in groups), lag)
    return out


def _kind(message: Message) -> str:
    """The field of `pb.Event`'s `kind` oneof that holds `message`."""
    for field in pb.Event.DESCRIPTOR.oneofs_by_name["kind"].fields:
        if field.message_type is message.DESCRIPTOR:
            return field.name
    raise TypeError(f"{type(message).__name__} is not an event kind")
