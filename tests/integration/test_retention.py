"""Stream retention and refused writes, over a real Redis.

Retention trims a stream only up to what every consumer group that needs it has acknowledged;
a write refused at `maxmemory` is retried until memory comes back and executes exactly once.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis

from magic.observability.metrics import REDIS_REFUSED
from magic.protocol import codec, keys
from magic.protocol.pb import messages_pb2 as pb
from magic.store import client as refusals
from magic.store import retention
from magic.store.streams import ConsumerGroup, Stream


def _event(i: int) -> pb.Event:
    return pb.Event(run_id="r", at=float(i), source=f"s{i}")


def _ids(r, stream) -> list[str]:
    return [i.decode() for i, _ in r.xrange(stream)]


def test_trims_only_what_every_needed_group_acknowledged(r):
    stream = "magic:{r}:scored"
    learner = ConsumerGroup(r, stream, "learner", "l1", dead_stream="magic:{r}:dead")
    other = ConsumerGroup(r, stream, "filter", "c1", dead_stream="magic:{r}:dead")
    learner.ensure()
    other.ensure()
    s = Stream(r, stream)
    ids = [s.add(_event(i)) for i in range(10)]

    got = learner.read(count=6, block_ms=10)
    learner.ack(*(e.id for e in got[:4]))  # 4 acked, 2 pending, 4 never delivered
    assert retention.trim_acknowledged(r, stream, ["learner", "filter"]) == 0  # filter saw nothing
    other.ack(*(e.id for e in other.read(count=10, block_ms=10)))
    assert retention.trim_acknowledged(r, stream, ["learner", "filter"]) == 4
    assert _ids(r, stream) == ids[4:]

    # a pending entry holds back everything after it, even acknowledged ones
    rest = learner.read(count=10, block_ms=10)
    learner.ack(*(e.id for e in rest))  # ids[6:] acked, ids[4:6] still pending
    assert retention.trim_acknowledged(r, stream, ["learner", "filter"]) == 0
    learner.ack(*(e.id for e in got[4:]))
    assert retention.trim_acknowledged(r, stream, ["learner", "filter"]) == 6
    assert len(s) == 0
    # the trimmed stream keeps working for both groups
    new = s.add(_event(99))
    assert [e.id for e in learner.read(count=5, block_ms=10)] == [new]


def test_missing_needed_group_blocks_trimming_and_foreign_groups_do_not(r):
    stream = "magic:{r}:scored"
    filt = ConsumerGroup(r, stream, "filter", "c1", dead_stream="magic:{r}:dead")
    filt.ensure()
    s = Stream(r, stream)
    for i in range(5):
        s.add(_event(i))
    filt.ack(*(e.id for e in filt.read(count=10, block_ms=10)))
    # the learner has not attached yet: its entries must wait for it
    assert retention.trim_acknowledged(r, stream, ["learner", "filter"]) == 0
    assert len(s) == 5
    # a tool's own group that nobody needs never holds entries back
    r.xgroup_create(stream, "debugger", id="0")
    assert retention.trim_acknowledged(r, stream, ["filter"]) == 5
    assert retention.trim_acknowledged(r, "magic:{r}:absent", ["filter"]) == 0


def test_release_step_trims_work_streams_and_old_weight_announcements(r):
    run = keys.RunKeys("r")
    needed = retention.consumers(run, "controller-filter")
    weights = Stream(r, run.weights)
    for v in (0, 1):
        weights.add(pb.WeightUpdate(run_id="r", version=v, transport="filesystem", uri=f"/w/v{v}"))
    join = weights.add(pb.WeightUpdate(run_id="r", version=2, transport="nccl", nccl=pb.NcclTransfer(join=pb.NcclGroup(id=1))))
    upd = weights.add(pb.WeightUpdate(run_id="r", version=2, transport="nccl", nccl=pb.NcclTransfer(update=pb.NcclUpdate())))
    prompts = ConsumerGroup(r, run.prompts, keys.ROLLOUT_GROUP, "w1", dead_stream=run.dead_of("rollout"))
    prompts.ensure()
    p = Stream(r, run.prompts)
    for i in range(3):
        p.add(pb.PromptGroup(run_id="r", group_id=f"1:{i}", step=1))
    prompts.ack(*(e.id for e in prompts.read(count=10, block_ms=10)))

    for k in (0, 1, 2):
        r.hset(run.step(k), "expected", 3)
        r.hset(run.groups(k), f"{k}:0", "digest")
    removed = retention.release_step(r, run, needed, served_version=2)
    # step 1 was just recorded (late copies of it may still be checked), step 2 runs: step 0 goes
    assert [bool(r.exists(run.step(k))) for k in (0, 1, 2)] == [False, True, True]
    assert [bool(r.exists(run.groups(k))) for k in (0, 1, 2)] == [False, True, True]
    assert removed[run.prompts] == 3 and removed[run.weights] == 2
    assert _ids(r, run.weights) == [join, upd]  # both entries of v2: the join stays for its group
    # a worker starting now reads the newest version from the start of the stream
    versions = [u.version for _, u in weights.read_after("0", pb.WeightUpdate)]
    assert versions == [2, 2]
    # nothing announced at the served version: the weights stream is left alone
    assert retention.release_step(r, run, needed, served_version=5)[run.weights] == 0


def test_dead_letters_are_capped(r):
    run = keys.RunKeys("r")
    group = ConsumerGroup(r, run.rollouts, keys.REWARD_GROUP, "w", dead_stream=run.dead_of("reward"), dead_letters_max=50)
    group.ensure()
    for i in range(400):
        r.xadd(run.rollouts, {b"junk": b"x" * 100})
    for e in group.read(count=400, block_ms=10):
        assert group.decode(e, pb.RolloutGroup) is None  # poison: dead-lettered
    assert 50 <= r.xlen(run.dead_of("reward")) < 400  # approximate trimming: whole nodes of ~100 entries
    assert retention.trim_acknowledged(r, run.rollouts, [keys.REWARD_GROUP]) == 400


@pytest.fixture
def full_redis():
    """A private Redis with a 4 MB maxmemory, filled with 1 kB entries until it refuses writes
    (the writes below are 10 kB, more than the room left)."""
    from magic.local.redis_server import RedisServer

    server = RedisServer(maxmemory="4mb").start()
    raw = redis.Redis.from_url(server.url)
    filler = "magic:{r}:rollouts"
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        for _ in range(100_000):
            raw.xadd(filler, {b"p": b"x" * 1000})
    yield server, raw, filler
    raw.close()
    server.stop()


def test_refused_write_is_retried_until_memory_comes_back(full_redis):
    server, raw, filler = full_redis
    c = refusals.client(server.url, patience=30)
    before = REDIS_REFUSED._value.get()
    freed = threading.Timer(0.5, lambda: raw.xtrim(filler, maxlen=0, approximate=False))  # a consumer acks, retention trims
    freed.start()
    t0 = time.monotonic()
    pipe = c.pipeline(transaction=True)  # refused as a whole (EXECABORT), then sent again once
    pipe.xadd("magic:{r}:scored", {b"p": b"y" * 10_000})
    pipe.hset("magic:{r}:state", "step", 1)
    pipe.execute()
    freed.join()
    assert time.monotonic() - t0 >= 0.4
    assert REDIS_REFUSED._value.get() > before
    assert raw.xlen("magic:{r}:scored") == 1 and raw.hget("magic:{r}:state", "step") == b"1"
    c.close()


def test_refused_write_gives_up_after_patience(full_redis):
    server, raw, _ = full_redis
    c = refusals.client(server.url, patience=0.3)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        c.set("k", "v" * 10_000)
    assert c.xtrim("magic:{r}:rollouts", maxlen=0, approximate=False) > 0  # deletions are never refused
    assert c.set("k", "v")
    c.close()


def test_codec_payload_round_trips_after_trim(r):
    """Entries read after trimming decode as written (MINID never cuts into a kept entry)."""
    s = Stream(r, "magic:{r}:events")
    g = ConsumerGroup(r, s.key, "controller", "c", dead_stream="magic:{r}:dead")
    g.ensure()
    for i in range(3):
        s.add(_event(i))
    first = g.read(count=1, block_ms=10)
    g.ack(first[0].id)
    assert retention.trim_acknowledged(r, s.key, ["controller"]) == 1
    rest = g.read(count=5, block_ms=10)
    assert [codec.decode(e.fields, pb.Event).source for e in rest] == ["s1", "s2"]
