"""The message bus: Redis streams with consumer groups, at-least-once delivery, dead letters.

Three pieces:

* `Stream` — append a message, read the last one, or follow a stream with plain XREAD (the
  `weights` fan-out, where every rollout worker sees every entry).
* `ConsumerGroup` — the work queues (`prompts`, `rollouts`, `scored`, `events`). A consumer reads
  with XREADGROUP (blocking), acknowledges after its output is durably published, first re-reads
  its own unacknowledged entries after a restart, and reclaims entries left pending by consumers
  whose heartbeat has expired. An entry that cannot be decoded, or that has been delivered
  `max_deliveries` times without an ack (it keeps killing its consumers), is moved to the run's
  dead-letter stream together with the reason, and acknowledged.
* `StepLedger` — per-step accounting for the learner: collects each step's groups exactly once
  (duplicates from redelivery are recognised by group id) and says when a step is complete.

Consumers must be idempotent: a crash between publishing the output and acknowledging the input
re-delivers the input. Downstream, the learner's ledger drops the duplicate group.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import redis
from google.protobuf.message import Message

from magic.common import codec
from magic.common.metrics import DEAD_LETTERS
from magic.common.pb import messages_pb2 as pb

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
T = TypeVar("T")


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class Entry:
    """A stream entry as read: its id, raw fields and how many times it has been delivered."""

    id: str
    fields: dict[bytes, bytes]
    deliveries: int = 1


class Stream:
    """One Redis stream, used as a log: append, read the newest entry, follow with XREAD."""

    def __init__(self, r: redis.Redis, key: str):
        self.r = r
        self.key = key

    def add(self, msg: Message, maxlen: int | None = None) -> str:
        """Append `msg`; returns the entry id. `maxlen` trims old entries approximately."""
        return _s(self.r.xadd(self.key, codec.encode(msg), maxlen=maxlen, approximate=True))

    def last(self, cls: type[M]) -> tuple[str, M] | None:
        """The newest entry decoded as `cls`, or None when the stream is empty."""
        rows = self.r.xrevrange(self.key, count=1)
        if not rows:
            return None
        entry_id, fields = rows[0]
        return _s(entry_id), codec.decode(fields, cls)

    def read_after(self, last_id: str, cls: type[M], block_ms: int | None = None, count: int = 100) -> list[tuple[str, M]]:
        """Entries after `last_id` ("0" for all), waiting up to `block_ms` for the first one."""
        resp = self.r.xread({self.key: last_id}, count=count, block=block_ms)
        out = []
        for _key, rows in resp or []:
            for entry_id, fields in rows:
                out.append((_s(entry_id), codec.decode(fields, cls)))
        return out

    def __len__(self) -> int:
        return int(self.r.xlen(self.key))


class ConsumerGroup:
    """A consumer in a Redis consumer group, with recovery, reclaiming and dead letters."""

    def __init__(
        self,
        r: redis.Redis,
        stream: str,
        group: str,
        consumer: str,
        *,
        dead_stream: str,
        max_deliveries: int = 5,
    ):
        self.r = r
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.dead_stream = dead_stream
        self.max_deliveries = max_deliveries
        self._recovery_cursor: str | None = "0"  # re-read our own pending entries first

    def ensure(self) -> None:
        """Create the stream and the group if needed; the group starts at the stream's beginning."""
        try:
            self.r.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # -- reading -----------------------------------------------------------------------------

    def read(self, count: int = 1, block_ms: int = 1000) -> list[Entry]:
        """Up to `count` entries: first this consumer's own unacknowledged ones (after a restart),
        then new ones, blocking up to `block_ms` for them."""
        if self._recovery_cursor is not None:
            resp = self.r.xreadgroup(self.group, self.consumer, {self.stream: self._recovery_cursor}, count=count)
            rows = resp[0][1] if resp else []
            if rows:
                self._recovery_cursor = _s(rows[-1][0])
                entries = [Entry(_s(i), f or {}) for i, f in rows]
                return self._screen(entries, known_deliveries=None)
            self._recovery_cursor = None
        resp = self.r.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=count, block=block_ms)
        rows = resp[0][1] if resp else []
        return [Entry(_s(i), f) for i, f in rows]

    def reclaim(self, alive: Iterable[str], count: int = 100, min_idle_ms: int = 1000) -> list[Entry]:
        """Claim entries pending at consumers that are not in `alive` (their heartbeat expired).

        Entries that reached `max_deliveries` are dead-lettered instead of returned. A dead
        consumer with nothing left pending is removed from the group.
        """
        alive = set(alive) | {self.consumer}
        try:
            consumers = self.r.xinfo_consumers(self.stream, self.group)
        except redis.ResponseError:
            return []
        out: list[Entry] = []
        for info in consumers:
            name = _s(info["name"])
            if name in alive:
                continue
            rows = self.r.xpending_range(self.stream, self.group, "-", "+", count, consumername=name) if info["pending"] else []
            if not rows:
                self.r.xgroup_delconsumer(self.stream, self.group, name)
                continue
            deliveries = {_s(row["message_id"]): int(row["times_delivered"]) for row in rows}
            claimed = self.r.xclaim(self.stream, self.group, self.consumer, min_idle_ms, list(deliveries))
            log.warning("reclaimed %d entries of %s from dead consumer %s", len(claimed), self.stream, name)
            entries = [Entry(_s(i), f or {}, deliveries[_s(i)] + 1) for i, f in claimed]
            out.extend(self._screen(entries, known_deliveries=True))
        return out

    def _screen(self, entries: list[Entry], known_deliveries: bool | None) -> list[Entry]:
        """Drop deleted entries and dead-letter those delivered too often."""
        if not entries:
            return []
        if not known_deliveries:
            rows = self.r.xpending_range(self.stream, self.group, entries[0].id, entries[-1].id, len(entries) + 10, consumername=self.consumer)
            counts = {_s(row["message_id"]): int(row["times_delivered"]) for row in rows}
            for e in entries:
                e.deliveries = counts.get(e.id, e.deliveries)
        kept = []
        for e in entries:
            if not e.fields:
                self.ack(e.id)  # the entry was trimmed or deleted while pending
            elif e.deliveries > self.max_deliveries:
                self.dead_letter(e, f"delivered {e.deliveries} times without being acknowledged (max {self.max_deliveries})")
            else:
                kept.append(e)
        return kept

    # -- finishing ---------------------------------------------------------------------------

    def ack(self, *entry_ids: str) -> None:
        if entry_ids:
            self.r.xack(self.stream, self.group, *entry_ids)

    def dead_letter(self, entry: Entry, reason: str) -> None:
        """Move `entry` to the dead-letter stream with `reason`, then acknowledge it."""
        letter = pb.DeadLetter(
            stream=self.stream,
            entry_id=entry.id,
            reason=reason[:2000],
            deliveries=entry.deliveries,
            consumer=self.consumer,
            type=entry.fields.get(codec.TYPE_FIELD, b"").decode(errors="replace"),
            payload=entry.fields.get(codec.PAYLOAD_FIELD, b""),
        )
        pipe = self.r.pipeline(transaction=True)
        pipe.xadd(self.dead_stream, codec.encode(letter))
        pipe.xack(self.stream, self.group, entry.id)
        pipe.execute()
        DEAD_LETTERS.labels(stream=self.stream.rsplit(":", 1)[-1]).inc()
        log.error("dead-lettered %s %s: %s", self.stream, entry.id, reason)

    def decode(self, entry: Entry, cls: type[M]) -> M | None:
        """Decode `entry` as `cls`; a poison entry is dead-lettered and None returned."""
        try:
            return codec.decode(entry.fields, cls)
        except codec.PoisonMessage as exc:
            self.dead_letter(entry, f"poison message: {exc}")
            return None

    def pending_count(self) -> int:
        try:
            return int(self.r.xpending(self.stream, self.group)["pending"])
        except redis.ResponseError:
            return 0


@dataclass
class _StepItems(Generic[T]):
    items: dict[str, T] = field(default_factory=dict)  # group id -> item, first copy wins
    entry_ids: list[str] = field(default_factory=list)  # every entry seen, duplicates included


class StepLedger(Generic[T]):
    """Per-step accounting: each step's groups, each counted once, and whether the step is complete.

    `add` returns False for a group id the step already has (a redelivered or regenerated copy);
    the caller acknowledges such entries together with the step, so nothing is left pending.
    """

    def __init__(self) -> None:
        self._steps: dict[int, _StepItems[T]] = {}
        self.duplicates = 0

    def add(self, step: int, group_id: str, entry_id: str, item: T) -> bool:
        s = self._steps.setdefault(step, _StepItems())
        s.entry_ids.append(entry_id)
        if group_id in s.items:
            self.duplicates += 1
            return False
        s.items[group_id] = item
        return True

    def count(self, step: int) -> int:
        s = self._steps.get(step)
        return len(s.items) if s else 0

    def is_complete(self, step: int, expected: int) -> bool:
        return self.count(step) >= expected

    def steps(self) -> list[int]:
        return sorted(self._steps)

    def pop(self, step: int) -> tuple[list[T], list[str]]:
        """Remove the step: its items in group-id order and every entry id to acknowledge."""
        s = self._steps.pop(step, None)
        if s is None:
            return [], []
        return [s.items[k] for k in sorted(s.items)], s.entry_ids


def wait_until(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):
    """Poll `predicate` until it returns a truthy value; raise TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
