"""Leases with fencing epochs against a real Redis: a holder that lost its lease cannot write at all
(even a write already started when the lease changed), a lease is never taken back under an old
epoch, an ended run is never changed, and a Redis that lost writes is noticed (`magic.store.lease`)."""

from __future__ import annotations

import threading
import time

import pytest

from magic.config.schema import RunSpec
from magic.protocol import keys
from magic.protocol.pb import messages_pb2 as pb
from magic.store.lease import LEARNER, Lease, LeaseLost, RedisLostData, RunEnded
from magic.store.runs import Runs
from magic.store.streams import Stream

pytestmark = pytest.mark.integration

RUN = "fenced"
K = keys.RunKeys(RUN)


def lease(r, holder: str, ttl: float = 0.5, role: str = "controller") -> Lease:
    return Lease(r, RUN, role, holder, ttl)


def test_each_acquisition_takes_a_new_epoch_and_only_one_holder_holds_it(r):
    a, b = lease(r, "a"), lease(r, "b")
    assert a.try_acquire() and a.epoch == 1
    assert not b.try_acquire() and b.epoch is None
    time.sleep(0.6)  # a's lease expires (a paused past it)
    assert b.try_acquire() and b.epoch == 2
    assert not a.renew(force=True) and a.epoch is None  # never taken back under epoch 1
    with pytest.raises(LeaseLost):
        with a.transaction() as tx:
            tx.set(K.spec, "from a")
    assert r.get(K.spec) is None
    with b.transaction() as tx:
        tx.set(K.spec, "from b")
    assert r.get(K.spec) == b"from b"
    b.release()
    assert a.try_acquire() and a.epoch == 3  # acquiring again is a new lease, with a new epoch


def test_a_write_started_before_the_lease_changed_does_nothing(r):
    """The lease changes between the holder's check and its EXEC (it was paused there): Redis
    aborts the EXEC because the transaction WATCHed the lease key."""
    a = lease(r, "a", ttl=5)
    assert a.try_acquire()
    with pytest.raises(LeaseLost):
        with a.transaction() as tx:
            tx.xadd(K.events_of("learner"), {"type": "x", "pb": b""})
            r.set(K.lease("controller"), "b 99", px=5000)  # another holder took it meanwhile
    assert r.xlen(K.events_of("learner")) == 0 and a.epoch is None


def test_a_write_whose_lease_expired_mid_transaction_does_nothing(r):
    a = lease(r, "a", ttl=0.3)
    assert a.try_acquire()
    with pytest.raises(LeaseLost):
        with a.transaction() as tx:
            tx.xadd(K.events_of("learner"), {"type": "x", "pb": b""})
            time.sleep(0.5)  # paused past the lease inside the write: the watched key expired
    assert r.xlen(K.events_of("learner")) == 0


def test_an_ended_run_refuses_the_lease_and_every_fenced_write(r):
    a = lease(r, "a", ttl=5)
    assert a.try_acquire()
    with a.transaction() as tx:
        tx.hset(K.state, "status", "finished")
    with pytest.raises(RunEnded):
        with a.transaction() as tx:
            tx.hset(K.state, "status", "failed")
    assert r.hget(K.state, "status") == b"finished"
    a.release()
    assert not lease(r, "stale").acquire(threading.Event())  # a stale controller cannot revive it
    with pytest.raises(RunEnded):
        lease(r, "b").try_acquire()


def test_a_redis_that_lost_writes_is_noticed_by_every_holder(r):
    a = lease(r, "a", ttl=5)
    assert a.try_acquire()
    for _ in range(3):
        with a.transaction() as tx:
            tx.xadd(K.events_of("learner"), {"type": "x", "pb": b""})
    assert a.seen == 3 and int(r.get(K.seq())) == 3
    r.set(K.seq(), 1)  # Redis came back from an older state
    with pytest.raises(RedisLostData, match="write counter seq is 1, this controller saw 3"):
        a.check()
    with pytest.raises(RedisLostData):
        with a.transaction() as tx:
            tx.xadd(K.events_of("learner"), {"type": "x", "pb": b""})
    assert r.xlen(K.events_of("learner")) == 3
    a.accept_loss()  # to record the run's failure
    with a.transaction() as tx:
        tx.hset(K.state, "status", "failed")


def test_a_kept_lease_survives_a_long_step_and_a_lost_one_stops_the_writes(r):
    """The learner's lease is renewed by a thread while its loop trains for longer than the TTL;
    once the renewal fails (another learner took it after a pause), the next write raises."""
    a = lease(r, "learner-a", ttl=1.0, role=LEARNER)  # a TTL that a loaded machine's scheduling hiccups do not reach
    assert a.try_acquire()
    a.keep(0.05)
    time.sleep(2.5)  # training, longer than the TTL
    stream = Stream(r, K.weights, a)
    stream.add(pb.WeightUpdate(run_id=RUN, version=1))
    r.set(K.lease(LEARNER), "learner-b 2", px=5000)  # learner-b took it while a was paused
    time.sleep(0.2)
    with pytest.raises(LeaseLost):
        stream.add(pb.WeightUpdate(run_id=RUN, version=2))
    assert [u.version for _, u in stream.read_after("0", pb.WeightUpdate)] == [1]
    a.stop_keeping()


def test_the_durable_record_outlives_a_redis_that_lost_the_run(r, tmp_path):
    runs = Runs(r, tmp_path)
    spec = RunSpec(name="kept", model="/m", datasets=["d"], stages=[{"steps": 3, "T": 8, "D_R": 2, "gs": 2}])
    runs.create(spec)
    assert runs["kept"].lost_state() is None and runs.lost() == []
    runs["kept"].record_durably(step=2)  # the controller recorded two steps
    assert "holds 0 recorded steps of run kept, the controller recorded 2" in runs["kept"].lost_state()
    r.flushall()  # Redis restarted empty
    assert runs.list() == ["kept"] and runs["kept"].spec() == spec
    assert "holds nothing of run kept" in runs["kept"].lost_state() and runs.lost() == ["kept"]
