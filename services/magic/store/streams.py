"""The message bus: Redis streams with consumer groups, at-least-once delivery, dead letters.

Three pieces:

* `Stream` — append a message, read the last one, or follow a stream with plain XREAD (the
  `weights` fan-out, where every rollout worker sees every entry).
* `ConsumerGroup` — the work queues (`prompts`, `rollouts`, `scored`, `events`). A consumer reads
  with XREADGROUP (blocking), acknowledges after its output is durably published, first re-reads
  its own unacknowledged entries after a restart, and reclaims entries left pending by consumers
  whose heartbeat has expired. An entry that cannot be decoded, or that has been delivered
  `max_deliveries` times without an ack (it keeps killing its consumers), is moved to the run's
  dead-letter stream together with the reason, and acknowledged. The dead-letter stream keeps the
  newest `DEAD_LETTERS_MAX` letters; the work streams are trimmed by `magic.store.retention`.

Consumers must be idempotent: a crash between publishing the output and acknowledging the input
re-delivers the input. Downstream, the learner's ledger (`magic.learner.ledger`) drops the
duplicate group. Every consumer checks what it decoded (`decode(..., check=...)`): a message
that parses but is not what the producer published is dead-lettered with the reason.

Redis restarts and refusals: `magic.store.client.RETRYABLE` names the errors after which the
same call succeeds once Redis is back; the service runtime waits them out and re-attaches its worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import redis
from google.protobuf.message import Message

from magic.observability.metrics import DEAD_LETTERS
from magic.protocol import codec
from magic.protocol.pb import messages_pb2 as pb
from magic.store.heartbeat import HEARTBEAT_TTL, alive_workers
from magic.store.lease import Direct, Writer

log = logging.getLogger(__name__)

DEAD_LETTERS_MAX = 1000
"""Dead letters kept per run (the oldest are trimmed, approximately). `magic_dead_letters` counts them all."""
DEAD_LETTER_PAYLOAD_MAX = 256 << 10
"""Bytes of a poison entry's payload a dead letter keeps (its full size is recorded): the
dead-letter stream holds at most DEAD_LETTERS_MAX x 256 KiB ≈ 256 MiB however large the poison
(a poison rollout group at the paper's shape is ≈ 1.5 MB)."""

M = TypeVar("M", bound=Message)

def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class Entry:
    """A stream entry as read: its id, raw fields and how many times it has been delivered."""

    id: str
    fields: dict[bytes, bytes]
    deliveries: int = 1


_DEAD_ONCE = """
if redis.call('sadd', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('xadd', KEYS[2], '*', unpack(ARGV, 2))
return 1
"""


def _flat(fields: dict[bytes, bytes]) -> list[bytes]:
    return [x for kv in fields.items() for x in kv]


def _letter(stream: str, entry: Entry, reason: str, consumer: str, keep_payload: bool = True) -> pb.DeadLetter:
    payload = entry.fields.get(codec.PAYLOAD_FIELD, b"")
    return pb.DeadLetter(
        stream=stream,
        entry_id=entry.id,
        reason=reason[:2000],
        deliveries=entry.deliveries,
        consumer=consumer,
        type=entry.fields.get(codec.TYPE_FIELD, b"").decode(errors="replace")[:200],
        payload=payload[:DEAD_LETTER_PAYLOAD_MAX] if keep_payload else b"",
        payload_bytes=len(payload),
    )


class Stream:
    """One Redis stream, used as a log: append, read the newest entry, follow with XREAD. Appends
    go through `writer`: a lease (fenced writes, `magic.store.lease`) or none."""

    def __init__(self, r: redis.Redis, key: str, writer: Writer | None = None):
        self.r = r
        self.key = key
        self.writer = writer or Direct(r)

    def add(self, msg: Message, maxlen: int | None = None) -> str:
        """Append `msg`; returns the entry id. `maxlen` trims old entries approximately."""
        with self.writer.transaction() as tx:
            tx.xadd(self.key, codec.encode(msg), maxlen=maxlen, approximate=True)
        return _s(tx.replies[0])

    def newest(
        self, cls: type[M], check: Callable[[M], str | None] | None = None, rank: Callable[[M], tuple] | None = None, page: int = 256
    ) -> tuple[str, M] | None:
        """The newest entry that decodes as `cls` and passes `check` (poison and refused entries are
        skipped, however many), or None when the stream holds none. With `rank`, the entry of the
        highest rank instead (the newest among equals): an announcement replayed after newer ones,
        or junk appended after them, does not hide the newest version. Reads the stream backwards,
        `page` entries at a time (a fan-out stream is trimmed to a few steps' entries)."""
        best: tuple[tuple, str, M] | None = None
        last = "+"
        while True:
            rows = self.r.xrevrange(self.key, max=last, count=page)
            for entry_id, fields in rows:
                try:
                    msg = codec.decode(fields, cls)
                except codec.PoisonMessage:
                    continue
                if check is not None and check(msg) is not None:
                    continue
                if rank is None:
                    return _s(entry_id), msg
                if best is None or rank(msg) > best[0]:
                    best = (rank(msg), _s(entry_id), msg)
            if len(rows) < page:
                return None if best is None else (best[1], best[2])
            last = "(" + _s(rows[-1][0])

    def read_after(
        self, last_id: str, cls: type[M], block_ms: int | None = None, count: int = 100, *, poison: Callable[[Entry, str], None] | None = None
    ) -> list[tuple[str, M]]:
        """Entries after `last_id` ("0" for all), waiting up to `block_ms` for the first one. An
        entry that does not decode is skipped and handed to `poison(entry, reason)` (by default it
        raises PoisonMessage: a plain log has nobody to dead-letter for)."""
        resp = self.r.xread({self.key: last_id}, count=count, block=block_ms)
        out = []
        for _key, rows in resp or []:
            for entry_id, fields in rows:
                try:
                    out.append((_s(entry_id), codec.decode(fields, cls)))
                except codec.PoisonMessage as exc:
                    if poison is None:
                        raise
                    poison(Entry(_s(entry_id), fields), f"poison message: {exc}")
        return out

    def dead_letter_once(self, entry: Entry, reason: str, dead_stream: str, consumer: str) -> bool:
        """Record a poison entry of this (fan-out) stream in `dead_stream` once, however many
        followers find it; returns True if this call recorded it."""
        letter = _letter(self.key, entry, reason, consumer)
        with self.writer.transaction() as tx:
            tx.eval(_DEAD_ONCE, 2, f"{dead_stream}:seen", dead_stream, f"{self.key}/{entry.id}", *_flat(codec.encode(letter)))
        first = tx.replies[0]
        if first:
            DEAD_LETTERS.labels(stream=self.key.rsplit(":", 1)[-1]).inc()
            log.error("dead-lettered %s %s: %s", self.key, entry.id, reason)
        return bool(first)

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
        dead_letters_max: int = DEAD_LETTERS_MAX,
        writer: Writer | None = None,
    ):
        self.r = r
        self.writer = writer or Direct(r)
        """How acknowledgements, dead letters and outputs are written: under a lease or not."""
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.dead_stream = dead_stream
        self.max_deliveries = max_deliveries
        self.dead_letters_max = dead_letters_max
        self._recovery_cursor: str | None = "0"  # re-read our own pending entries first
        self._last_reclaim = float("-inf")
        # the stream's dead-letter series at 0 from now on: a counter that first appears at 1 is
        # invisible to increase(), and the MagicDeadLetters alert would miss the first letter
        DEAD_LETTERS.labels(stream=stream.rsplit(":", 1)[-1])

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

    def reclaim_if_due(self, service: str, every_seconds: float, heartbeat_ttl: float = HEARTBEAT_TTL) -> list[Entry]:
        """`reclaim` from the consumers of `service` whose heartbeat expired (or is older than
        `heartbeat_ttl`), at most once per `every_seconds` (each worker calls it from its loop; half
        the heartbeat TTL is usual)."""
        now = time.monotonic()
        if now - self._last_reclaim < every_seconds:
            return []
        self._last_reclaim = now
        return self.reclaim(alive_workers(self.r, service, max_age=heartbeat_ttl))

    def reclaim_from_others_if_due(self, every_seconds: float) -> list[Entry]:
        """`reclaim` from every other consumer, at most once per `every_seconds`: for a group only
        one process may consume (the holder of a lease), whatever the others' heartbeats say."""
        now = time.monotonic()
        if now - self._last_reclaim < every_seconds:
            return []
        self._last_reclaim = now
        return self.reclaim(alive=())

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
            with self.writer.transaction() as tx:
                tx.xack(self.stream, self.group, *entry_ids)

    def publish_and_ack(self, out: Stream, messages: list[Message | dict[bytes, bytes]], entry_ids: list[str]) -> None:
        """Append `messages` to `out` and acknowledge `entry_ids`, in one MULTI: a consumer's output
        and the acknowledgement of its input are durable together or not at all (a run's streams
        share one hash slot). A message may come encoded already (`codec.encode_around`)."""
        with self.writer.transaction() as tx:
            for msg in messages:
                tx.xadd(out.key, msg if isinstance(msg, dict) else codec.encode(msg))
            if entry_ids:
                tx.xack(self.stream, self.group, *entry_ids)

    def queue_ack(self, pipe: redis.client.Pipeline, *entry_ids: str) -> None:
        """Queue the acknowledgement of `entry_ids` on `pipe` (a transaction of the caller's)."""
        pipe.xack(self.stream, self.group, *entry_ids)

    def still_pending(self, entry_ids: list[str]) -> set[str]:
        """The entries of `entry_ids` no consumer has acknowledged yet."""
        pipe = self.r.pipeline(transaction=False)
        for entry_id in entry_ids:
            pipe.xpending_range(self.stream, self.group, entry_id, entry_id, 1)
        return {entry_id for entry_id, rows in zip(entry_ids, pipe.execute()) if rows}

    def claim_idle(self, min_idle_ms: int, count: int) -> list[Entry]:
        """Claim up to `count` entries pending at other consumers for at least `min_idle_ms`
        (stragglers of live consumers: their copy may still finish too)."""
        rows = self.r.xpending_range(self.stream, self.group, "-", "+", count * 4, idle=min_idle_ms)
        ids = [row["message_id"] for row in rows if _s(row["consumer"]) != self.consumer][:count]
        if not ids:
            return []
        return [Entry(_s(i), f or {}) for i, f in self.r.xclaim(self.stream, self.group, self.consumer, min_idle_ms, ids)]

    def dead_letter(self, entry: Entry, reason: str, keep_payload: bool = True) -> None:
        """Move `entry` to the dead-letter stream with `reason` (and the first 256 KiB of its
        payload, unless not `keep_payload`: a one-line letter), then acknowledge it."""
        letter = _letter(self.stream, entry, reason, self.consumer, keep_payload)
        with self.writer.transaction() as tx:
            tx.xadd(self.dead_stream, codec.encode(letter), maxlen=self.dead_letters_max, approximate=True)
            tx.xack(self.stream, self.group, entry.id)
        DEAD_LETTERS.labels(stream=self.stream.rsplit(":", 1)[-1]).inc()
        log.error("dead-lettered %s %s: %s", self.stream, entry.id, reason)

    def decode(self, entry: Entry, cls: type[M], check: Callable[[M], str | None] | None = None) -> M | None:
        """Decode `entry` as `cls` and `check` it (None: fine, else the reason it is refused); a
        poison or refused entry is dead-lettered with the reason and None returned."""
        try:
            msg = codec.decode(entry.fields, cls)
        except codec.PoisonMessage as exc:
            self.dead_letter(entry, f"poison message: {exc}")
            return None
        problem = check(msg) if check is not None else None
        if problem is not None:
            self.dead_letter(entry, f"refused {cls.DESCRIPTOR.name}: {problem}")
            return None
        return msg

    def pending_count(self) -> int:
        try:
            return int(self.r.xpending(self.stream, self.group)["pending"])
        except redis.ResponseError:
            return 0
