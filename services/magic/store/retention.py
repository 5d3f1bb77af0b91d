"""Stream retention: every run stream holds only what some consumer still needs.

Redis streams keep entries until they are deleted, and at the paper's shape (D_R = 256 prompts
× gs = 16 samples of up to 16k tokens) `rollouts` + `scored` grow by ≈ 0.5 GB a step. The rule:

* a work stream (`prompts`, `rollouts`, `scored`, `events:<role>`, `estimates`) keeps every entry that
  one of the consumer groups that need it has not acknowledged yet — it is trimmed up to the
  oldest entry still pending at, or not yet delivered to, any of those groups
  (`XTRIM MINID`). If a group that needs the stream does not exist yet (a learner that has not
  attached), the stream is left alone: nothing is removed before its consumer saw it;
* `weights` (plain XREAD fan-out, no group) keeps the announcements of the newest version every
  live rollout worker serves and anything after — what a worker that starts now needs;
* `dead:<role>` is capped by length where dead letters are written (`MAGIC_DEAD_LETTERS_MAX`).

The step barrier knows when a step's entries are done with: the controller calls
`release_step` when it records a step (every rollout, score and event of the step is
acknowledged by then), and `release_acknowledged` every second from a thread of its own, so
acknowledged rollouts leave Redis while the step is still running. Trimming needs no free memory (XTRIM, XACK and
XDEL are never refused at `maxmemory`), so it also unblocks a Redis that refuses writes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import redis

from magic.protocol import codec, keys
from magic.protocol.pb import messages_pb2 as pb
from magic.store.lease import Direct, LeaseLost, RedisLostData, RunEnded, Writer
from magic.store.streams import DEAD_LETTERS_MAX
from magic.store.steps import validation_scope

log = logging.getLogger(__name__)

StreamId = tuple[int, int]


def parse_id(raw: bytes | str) -> StreamId:
    """"<ms>-<seq>" -> (ms, seq)."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def format_id(entry: StreamId) -> str:
    return f"{entry[0]}-{entry[1]}"


def next_id(entry: StreamId) -> StreamId:
    """The smallest id after `entry`."""
    return entry[0], entry[1] + 1


@dataclass(frozen=True)
class GroupPosition:
    """Where a consumer group stands on a stream: the last entry delivered to it, and its oldest
    entry delivered but not acknowledged (None when nothing is pending)."""

    name: str
    last_delivered: StreamId
    oldest_pending: StreamId | None


def trim_bound(groups: Sequence[GroupPosition], needed: Sequence[str]) -> StreamId | None:
    """The MINID bound below which every group in `needed` has acknowledged every entry, or None
    when nothing may be trimmed (a needed group does not exist yet, or nothing is needed).

    Groups not in `needed` (a tool reading the stream with its own group) never hold entries back.

    >>> g = [GroupPosition("learner", (5, 0), (3, 1)), GroupPosition("filter", (7, 0), None)]
    >>> trim_bound(g, ["learner", "filter"])
    (3, 1)
    >>> trim_bound(g, ["filter"])
    (7, 1)
    >>> trim_bound(g, ["learner", "reward"]) is None
    True
    """
    by_name = {g.name: g for g in groups}
    if not needed or any(name not in by_name for name in needed):
        return None
    bounds = []
    for name in needed:
        g = by_name[name]
        bounds.append(g.oldest_pending if g.oldest_pending is not None else next_id(g.last_delivered))
    return min(bounds)


def group_positions(r: redis.Redis, stream: str) -> list[GroupPosition]:
    """Every consumer group of `stream` (none when the stream does not exist)."""
    try:
        infos = r.xinfo_groups(stream)
    except redis.ResponseError:
        return []
    out = []
    for info in infos:
        name = info["name"].decode() if isinstance(info["name"], bytes) else info["name"]
        oldest = None
        if int(info["pending"]):
            summary = r.xpending(stream, name)
            if summary["pending"] and summary["min"] is not None:
                oldest = parse_id(summary["min"])
        out.append(GroupPosition(name, parse_id(info["last-delivered-id"]), oldest))
    return out


def trim_acknowledged(r: redis.Redis, stream: str, needed: Sequence[str], writer: Writer | None = None) -> int:
    """Remove the entries of `stream` that every group in `needed` has acknowledged; returns
    how many were removed. Safe against concurrent consumers: an entry can only become pending
    after it was delivered, and delivery only moves forward past the bound."""
    bound = trim_bound(group_positions(r, stream), needed)
    if bound is None:
        return 0
    with (writer or Direct(r)).transaction() as tx:
        tx.xtrim(stream, minid=format_id(bound), approximate=False)
    return int(tx.replies[0])


def weights_bound(r: redis.Redis, stream: str, version: int, scan: int = 64) -> StreamId | None:
    """Id of the oldest announcement of `version` or later on the `weights` stream (entries before
    it concern older versions: no live worker and no newcomer needs them), or None if the stream
    has no announcement of `version` yet."""
    bound = None
    last = "+"
    while True:
        rows = r.xrevrange(stream, max=last, min="-", count=scan)
        for entry_id, fields in rows:
            try:
                update = codec.decode(fields, pb.WeightUpdate)
            except codec.PoisonMessage:
                continue
            if update.version < version:
                return bound
            bound = parse_id(entry_id)
        if len(rows) < scan:
            return bound
        last = "(" + (rows[-1][0].decode() if isinstance(rows[-1][0], bytes) else rows[-1][0])


def release_acknowledged(r: redis.Redis, run: keys.RunKeys, needed_by: Mapping[str, Sequence[str]], writer: Writer | None = None) -> dict[str, int]:
    """Trim every work stream of `run` to what its consumers still need.

    `needed_by` maps a stream key to the consumer groups that must see each of its entries
    (see `consumers`). Returns the number of entries removed per stream key."""
    return {stream: trim_acknowledged(r, stream, groups, writer) for stream, groups in needed_by.items()}


def release_step(r: redis.Redis, run: keys.RunKeys, needed_by: Mapping[str, Sequence[str]], served_version: int, writer: Writer | None = None) -> dict[str, int]:
    """Step k is recorded and every live rollout worker serves `served_version` (k + 1): trim the
    work streams, the weight announcements of older versions and each role's dead letters beyond
    the newest `DEAD_LETTERS_MAX` (a role's credentials can append without MAXLEN), and drop the bookkeeping hashes
    (`step`, `groups`) of step k - 1: its record is in the run's metrics list, and no worker
    generates for it any more (a worker drops groups of a version it no longer serves)."""
    writer = writer or Direct(r)
    removed = release_acknowledged(r, run, needed_by, writer)
    bound = weights_bound(r, run.weights, served_version)
    with writer.transaction() as tx:
        for dead in run.dead_streams():  # a role's credentials can append letters without MAXLEN: the newest are kept
            tx.xtrim(dead, maxlen=DEAD_LETTERS_MAX, approximate=True)
        if served_version >= 2:  # step k - 1's hashes: a late copy of step k may still be checked against groups(k)
            tx.delete(run.step(served_version - 2), run.groups(served_version - 2), run.groups(validation_scope(served_version - 2)))
        if bound:
            tx.xtrim(run.weights, minid=format_id(bound), approximate=False)
    removed[run.weights] = int(tx.replies[-1]) if bound else 0
    return removed


def consumers(run: keys.RunKeys, filter_group: str) -> dict[str, tuple[str, ...]]:
    """The consumer groups that must see every entry of each work stream of `run`."""
    return {
        run.prompts: (keys.ROLLOUT_GROUP,),
        run.rollouts: (keys.REWARD_GROUP,),
        run.scored: (keys.LEARNER_GROUP, filter_group),
        **{run.events_of(role): (keys.CONTROLLER_GROUP,) for role in keys.SENDERS},
        run.estimates: (keys.CONTROLLER_GROUP,),
    }


class Retention:
    """The controller's handle on one run's retention: `release_step` when a step is recorded,
    and a daemon thread that trims acknowledged entries every `interval` seconds meanwhile —
    on its own thread, so it keeps freeing memory while the driver waits out a refused write."""

    def __init__(self, r: redis.Redis, run_id: str, filter_group: str, interval: float = 1.0, enabled: bool = True, writer: Writer | None = None):
        self.enabled = enabled
        self.r = r
        self.writer = writer
        self.keys = keys.RunKeys(run_id)
        self.needed_by = consumers(self.keys, filter_group)
        self.interval = interval
        self.removed = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def release_acknowledged(self) -> int:
        if not self.enabled:
            return 0
        n = sum(release_acknowledged(self.r, self.keys, self.needed_by, self.writer).values())
        self.removed += n
        return n

    def release_step(self, served_version: int) -> int:
        if not self.enabled:
            return 0
        n = sum(release_step(self.r, self.keys, self.needed_by, served_version, self.writer).values())
        self.removed += n
        return n

    def start(self) -> "Retention":
        if not self.enabled:
            return self
        self._stop.clear()  # started again after a stop (a driver that lost its lease and took it back)
        self._thread = threading.Thread(target=self._loop, name=f"retention-{self.keys.run}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.release_acknowledged()
            except redis.RedisError as exc:  # Redis away: the next round tries again
                log.debug("retention of run %s: %s", self.keys.run, exc)
            except (LeaseLost, RunEnded, RedisLostData) as exc:  # the driver learns it too, and stops this thread
                log.info("retention of run %s stops: %s", self.keys.run, exc)
                return
