"""The bus over a real redis-server: groups, acks, recovery, reclaiming, dead letters, ledger."""

import pytest

from magic.learner.ledger import StepLedger
from magic.protocol import codec, keys
from magic.protocol.pb import messages_pb2 as pb
from magic.store.heartbeat import Heartbeat, alive_workers
from magic.store.streams import ConsumerGroup, Stream

pytestmark = pytest.mark.integration

K = keys.RunKeys("t")


def group(r, consumer, max_deliveries=3):
    g = ConsumerGroup(r, K.prompts, "rollout", consumer, dead_stream=K.dead_of("rollout"), max_deliveries=max_deliveries)
    g.ensure()
    return g


def publish(r, n):
    s = Stream(r, K.prompts)
    return [s.add(pb.PromptGroup(group_id=f"0:{i:05d}")) for i in range(n)]


def test_each_entry_goes_to_one_consumer_and_ack_clears_it(r):
    a, b = group(r, "a"), group(r, "b")
    publish(r, 4)
    got_a = a.read(count=2, block_ms=100)
    got_b = b.read(count=10, block_ms=100)
    assert len(got_a) == 2 and len(got_b) == 2
    assert not {e.id for e in got_a} & {e.id for e in got_b}
    assert a.pending_count() == 4
    a.ack(*(e.id for e in got_a))
    b.ack(*(e.id for e in got_b))
    assert a.pending_count() == 0
    assert a.read(block_ms=50) == []


def test_group_created_after_publishing_still_sees_earlier_entries(r):
    publish(r, 2)
    g = group(r, "late")
    assert len(g.read(count=10, block_ms=100)) == 2


def test_a_restarted_consumer_rereads_its_own_pending_entries_first(r):
    publish(r, 3)
    first = group(r, "w1")
    got = first.read(count=3, block_ms=100)
    first.ack(got[0].id)
    again = group(r, "w1")  # same name, new process
    recovered = again.read(count=10)
    assert [e.id for e in recovered] == [got[1].id, got[2].id]
    assert all(e.deliveries == 2 for e in recovered)
    assert again.read(count=10, block_ms=50) == []  # then only new entries


def test_entries_of_a_dead_consumer_are_reclaimed_and_it_is_removed(r):
    publish(r, 2)
    dead = group(r, "dead")
    ids = [e.id for e in dead.read(count=2, block_ms=100)]
    live = group(r, "live")
    claimed = live.reclaim(alive=["live"], min_idle_ms=0)
    assert [e.id for e in claimed] == ids
    assert all(e.deliveries == 2 for e in claimed)
    live.ack(*ids)
    live.reclaim(alive=["live"], min_idle_ms=0)  # nothing left: the dead consumer is dropped
    names = [c["name"].decode() for c in r.xinfo_consumers(K.prompts, "rollout")]
    assert "dead" not in names


def test_alive_consumers_keep_their_entries(r):
    publish(r, 1)
    busy = group(r, "busy")
    busy.read(block_ms=100)
    assert group(r, "other").reclaim(alive=["busy", "other"], min_idle_ms=0) == []


def test_a_poison_entry_goes_to_the_dead_letter_stream_with_its_reason(r):
    from prometheus_client import REGISTRY

    def dead_count():
        return REGISTRY.get_sample_value("magic_dead_letters_total", {"stream": "prompts"}) or 0.0

    before = dead_count()
    r.xadd(K.prompts, {b"type": b"PromptGroup", b"pb": b"\xff\xff\xff"})
    g = group(r, "c")
    entry = g.read(block_ms=100)[0]
    assert g.decode(entry, pb.PromptGroup) is None
    assert dead_count() == before + 1
    assert g.pending_count() == 0
    (_, fields), = r.xrange(K.dead_of("rollout"))
    letter = codec.decode(fields, pb.DeadLetter)
    assert letter.stream == K.prompts and letter.entry_id == entry.id and "cannot parse" in letter.reason
    assert letter.payload == b"\xff\xff\xff" and letter.consumer == "c"


def test_a_consumers_dead_letter_series_exists_at_0_before_its_first_letter(r):
    """A labelled counter has no sample until its first increment: the series would appear at 1 and
    the MagicDeadLetters alert (increase over a window) would miss the first letter. A consumer
    group creates its stream's series at 0, so the first letter is a visible 0 -> 1."""
    from prometheus_client import REGISTRY

    fresh = keys.RunKeys("t").prompts.replace("prompts", "fresh-work")
    assert REGISTRY.get_sample_value("magic_dead_letters_total", {"stream": "fresh-work"}) is None
    g = ConsumerGroup(r, fresh, "rollout", "c", dead_stream=K.dead_of("rollout"))
    g.ensure()
    assert REGISTRY.get_sample_value("magic_dead_letters_total", {"stream": "fresh-work"}) == 0.0
    r.xadd(fresh, {b"type": b"PromptGroup", b"pb": b"\xff"})
    assert g.decode(g.read(block_ms=100)[0], pb.PromptGroup) is None
    assert REGISTRY.get_sample_value("magic_dead_letters_total", {"stream": "fresh-work"}) == 1.0


def test_an_entry_that_keeps_killing_consumers_is_dead_lettered(r):
    publish(r, 1)
    for i in range(3):  # three consumers take it and die without acking
        group(r, f"victim{i}", max_deliveries=3).read(block_ms=100) if i == 0 else group(r, f"victim{i}", max_deliveries=3).reclaim(alive=[f"victim{i}"], min_idle_ms=0)
    survivor = group(r, "survivor", max_deliveries=3)
    assert survivor.reclaim(alive=["survivor"], min_idle_ms=0) == []
    (_, fields), = r.xrange(K.dead_of("rollout"))
    letter = codec.decode(fields, pb.DeadLetter)
    assert "delivered 4 times" in letter.reason and letter.deliveries == 4
    assert survivor.pending_count() == 0


def test_stream_follow_and_newest(r):
    s = Stream(r, K.weights)
    assert s.newest(pb.WeightUpdate) is None
    s.add(pb.WeightUpdate(version=0))
    last_id = s.add(pb.WeightUpdate(version=1))
    got = s.read_after("0", pb.WeightUpdate)
    assert [u.version for _, u in got] == [0, 1]
    assert s.newest(pb.WeightUpdate)[1].version == 1
    assert s.read_after(last_id, pb.WeightUpdate, block_ms=50) == []


def test_a_poison_entry_on_a_fan_out_stream_is_skipped_and_recorded_once(r):
    s = Stream(r, K.weights)
    s.add(pb.WeightUpdate(version=0))
    r.xadd(K.weights, {b"type": b"WeightUpdate", b"pb": b"\xff\xff garbage"})
    r.xadd(K.weights, {b"junk": b"1"})
    with pytest.raises(codec.PoisonMessage):  # without a handler the caller learns it at once
        s.read_after("0", pb.WeightUpdate)
    assert s.newest(pb.WeightUpdate)[1].version == 0  # the newest entry that is an announcement
    for follower in ("rollout-a", "rollout-b"):  # two followers find the same garbage
        seen = []
        got = s.read_after("0", pb.WeightUpdate, poison=lambda e, why, f=follower: seen.append(s.dead_letter_once(e, why, K.dead_of("rollout"), f)))
        assert [u.version for _, u in got] == [0]
        assert len(seen) == 2
    dead = Stream(r, K.dead_of("rollout")).read_after("0", pb.DeadLetter)
    assert len(dead) == 2 and {d.consumer for _, d in dead} == {"rollout-a"} and all(d.stream == K.weights for _, d in dead)


def test_ledger_counts_each_group_once():
    ledger = StepLedger()
    assert ledger.add(0, "0:00001", "1-0", "a")
    assert not ledger.add(0, "0:00001", "2-0", "a-again")
    assert ledger.add(0, "0:00000", "3-0", "b")
    assert ledger.count(0) == 2 and ledger.is_complete(0, 2) and not ledger.is_complete(0, 3)
    items, ids = ledger.pop(0)
    assert items == ["b", "a"] and ids == ["1-0", "2-0", "3-0"] and ledger.duplicates == 1
    assert ledger.count(0) == 0


def test_heartbeats_expire(r):
    hb = Heartbeat(r, "rollout", "w9", interval=0.05, ttl=0.2, status=lambda: {"version": 3}).start()
    assert alive_workers(r, "rollout")["w9"]["version"] == 3
    hb._stop.set()
    hb._thread.join()
    import time

    time.sleep(0.3)
    assert "w9" not in alive_workers(r, "rollout")
