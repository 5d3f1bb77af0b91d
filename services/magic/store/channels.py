"""One run's channels, bound to the run: what every service reads and writes of it.

    channels = RunChannels(r, run_id, "rollout", consumer="rollout-0", max_deliveries=5)
    channels.spec()                              the RunSpec the controller stored
    channels.group("prompts", ROLLOUT_GROUP)     a work queue of the run (dead letters to the role's `dead:<role>`)
    channels.stream("rollouts")                  a stream of the run, to append to or follow
    channels.report(pb.WorkerError(...))         an event to the controller, on the role's `events:<role>`
    channels.steps                               the step contract (`magic.store.steps`)
    channels.alive("rollout")                    live workers of a service, with their status
    channels.fenced(lease)                       the same, every write made under a lease

A process that holds a lease of the run (the controller's driver, the committing learner) uses
fenced channels: every write — an acknowledgement, a dead letter, an announcement, a commit — is
refused once the lease is lost (`magic.store.lease`).

The service runtime (`magic.runtime.service`) builds one per attach and hands it to the
service's worker; a worker reaches Redis through it and nothing else. Stream names are the
attributes of `magic.protocol.keys.RunKeys` (`prompts`, `rollouts`, `scored`, `weights`,
`estimates`); a role's events and dead letters go to streams of its own (`events_of(role)`,
`dead_of(role)`), the only ones of their kind its ACL user may append to (`magic.store.acl`).
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
from magic.store.heartbeat import HEARTBEAT_TTL, alive_workers
from magic.store.lease import Lease
from magic.store.steps import StepStore
from magic.store.streams import ConsumerGroup, Entry, Stream

log = logging.getLogger(__name__)


class RunChannels:
    def __init__(
        self, r: redis.Redis, run_id: str, role: str, consumer: str = "", max_deliveries: int = 5, fence: Lease | None = None,
        heartbeat_ttl: float = HEARTBEAT_TTL,
    ):
        if role not in keys.ROLES:
            raise ValueError(f"unknown role {role!r}; known: {', '.join(keys.ROLES)}")
        self._r = r
        self.run_id = run_id
        self.role = role
        """The role this process plays on the bus (its ACL user's): where its events and dead letters go."""
        self.keys = keys.RunKeys(run_id)
        self.heartbeat_ttl = heartbeat_ttl
        """A heartbeat older than this is no live worker (`magic.store.heartbeat.alive_workers`)."""
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
        return RunChannels(self._r, self.run_id, self.role, self.consumer, self.max_deliveries, lease, self.heartbeat_ttl)

    def spec(self) -> RunSpec:
        raw = self._r.get(self.keys.spec)
        if raw is None:
            raise RunGone(f"run {self.run_id!r} has no spec in Redis")
        return RunSpec.model_validate_json(raw)

    def stream(self, name: str) -> Stream:
        """The run's stream `name` ("weights", "rollouts", ...; "events": this role's)."""
        return Stream(self._r, self.keys.events_of(self.role) if name == "events" else getattr(self.keys, name), self.fence)

    @property
    def dead(self) -> str:
        """This role's dead-letter stream."""
        return self.keys.dead_of(self.role)

    def group(self, name: str, group: str, consumer: str | None = None) -> ConsumerGroup:
        """This process's consumer of the run's stream `name` (a key name such as "prompts", or a
        whole key: another role's `events_of(role)`) in consumer group `group`, created if needed
        (`ensure`); poison goes to this role's dead-letter stream."""
        key = name if name.startswith("magic:") else getattr(self.keys, name)
        out = ConsumerGroup(
            self._r, key, group, consumer or self.consumer, dead_stream=self.dead, max_deliveries=self.max_deliveries,
            writer=self.fence,
        )
        out.ensure()
        return out

    def dead_letter_once(self, stream: Stream, entry: Entry, reason: str) -> bool:
        """Record a poison entry of a fan-out stream once in the run's dead-letter stream."""
        return stream.dead_letter_once(entry, reason, self.dead, self.consumer)

    def alive(self, service: str) -> dict[str, dict]:
        """Live workers of `service` attached to this run: name -> last heartbeat's status."""
        return alive_workers(self._r, service, self.run_id, max_age=self.heartbeat_ttl)

    def report(self, message: Message) -> None:
        """Send an event of this process on its role's event stream (`pb.Event` kinds)."""
        self.stream("events").add(pb.Event(run_id=self.run_id, at=time.time(), source=self.consumer, **{_kind(message): message}))

    def report_fatal(self, service: str, exc: BaseException) -> None:
        """Tell the run's controller that this worker cannot go on (a WorkerError on its role's events)."""
        message = f"{type(exc).__name__}: {exc}"[:4000]
        try:
            self.report(pb.WorkerError(service=service, message=message))
        except redis.RedisError:
            log.exception("cannot report the fatal error to run %s", self.run_id)

    def stream_stats(self, names: tuple[str, ...]) -> dict[str, tuple[int, int | None, int | None]]:
        """(length, pending, lag) of each of the run's streams `names`; pending and lag are None for
        a stream without consumer groups, lag None where Redis cannot tell it (after deletions)."""
        return _stream_stats(self._r, self.keys, names)


def stream_keys(run: keys.RunKeys, name: str) -> list[str]:
    """The keys of the run's stream `name`: "events" and "dead" are one stream per role."""
    if name == "events":
        return [run.events_of(role) for role in keys.SENDERS]
    if name == "dead":
        return run.dead_streams()
    return [getattr(run, name)]


def _stream_stats(r: redis.Redis, run: keys.RunKeys, names: tuple[str, ...]) -> dict[str, tuple[int, int | None, int | None]]:
    """Per short name, summed over its keys (`stream_keys`)."""
    pipe = r.pipeline(transaction=False)
    plan = [(name, key) for name in names for key in stream_keys(run, name)]
    for _, key in plan:
        pipe.xlen(key)
        pipe.xinfo_groups(key)
    replies = pipe.execute(raise_on_error=False)
    length = {name: 0 for name in names}
    grouped: dict[str, list[dict]] = {name: [] for name in names}
    for i, (name, _) in enumerate(plan):
        n, groups = replies[2 * i], replies[2 * i + 1]
        length[name] += 0 if isinstance(n, Exception) else int(n)
        if not isinstance(groups, Exception):
            grouped[name] += groups
    out = {}
    for name in names:
        groups = grouped[name]
        if not groups:
            out[name] = (length[name], None, None)
            continue
        lags = [g.get("lag") for g in groups]
        lag = sum(int(x) for x in lags) if all(x is not None for x in lags) else None
        out[name] = (length[name], sum(int(g["pending"]) for g in groups), lag)
    return out


def _kind(message: Message) -> str:
    """The field of `pb.Event`'s `kind` oneof that holds `message`."""
    for field in pb.Event.DESCRIPTOR.oneofs_by_name["kind"].fields:
        if field.message_type is message.DESCRIPTOR:
            return field.name
    raise TypeError(f"{type(message).__name__} is not an event kind")
