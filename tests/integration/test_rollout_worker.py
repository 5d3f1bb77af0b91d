"""The rollout worker over a real Redis with the torch engine: dynamic pulling, versions, stragglers."""

from __future__ import annotations

import time

import pytest

from magic.protocol import keys
from magic.protocol.pb import messages_pb2 as pb
from magic.rollout.engine import TorchEngine
from magic.rollout.settings import RolloutSettings
from magic.rollout.worker import RolloutWorker
from magic.store.channels import RunChannels
from magic.store.steps import StepStore
from magic.store.streams import Stream
from magic.weights import make_receiver, make_sender
from magic.weights.config import FilesystemTransportConfig

pytestmark = pytest.mark.integration
RUN = "t"


def publish_weights(r, tmp_path, engine, version):
    sender = make_sender(FilesystemTransportConfig(), channels=RunChannels(r, RUN, "learner"), root=tmp_path / "weights",
                         config_json=engine.model.config.to_json_string(), keep=3)
    state = {k: v for k, v in engine.model.state_dict().items() if k != "lm_head.weight"}
    return sender.publish(version, state)


def publish_prompts(r, count, version=0, n=2, max_tokens=8, step=0, max_staleness=0):
    """Publish as the controller does (`StepStore.publish_groups`: the groups and their digests)."""
    groups = []
    for i in range(count):
        g = pb.PromptGroup(run_id=RUN, group_id=f"{step}:{i:05d}", step=step, policy_version=version, published_at=time.time(), max_staleness=max_staleness,
                           sampling=pb.SamplingParams(n=n, temperature=1.0, top_p=1.0, max_tokens=max_tokens, seed=i))
        g.messages.add(role="user", content=f"Add {i}+1")
        groups.append(g)
    pipe = r.pipeline(transaction=True)
    StepStore(r, RUN).publish_groups(pipe, step, groups)
    pipe.execute()


def make_worker(r, tiny_model_dir, tmp_path, name, **settings):
    s = RolloutSettings(worker_name=name, max_batch_sequences=settings.pop("max_batch_sequences", 4), **settings)
    engine = TorchEngine(str(tiny_model_dir), max_batch_sequences=s.max_batch_sequences)
    return RolloutWorker(RunChannels(r, RUN, "rollout", name, s.max_deliveries), s, engine, make_receiver(s.weight_transport, worker_name=name, cache_dir=tmp_path / name))


def rollouts(r):
    return [g for _, g in Stream(r, keys.RunKeys(RUN).rollouts).read_after("0", pb.RolloutGroup, count=1000)]


def drive(workers, until, timeout=60):
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out"
        for w in workers:
            w.poll()


def test_two_workers_share_the_queue_and_every_group_is_generated_once(r, tiny_model_dir, tmp_path):
    a = make_worker(r, tiny_model_dir, tmp_path, "a")
    b = make_worker(r, tiny_model_dir, tmp_path, "b")
    publish_weights(r, tmp_path, a.engine, 0)
    publish_prompts(r, 12)
    drive([a, b], lambda: len(rollouts(r)) >= 12)
    got = rollouts(r)
    assert sorted(g.prompt.group_id for g in got) == sorted(f"0:{i:05d}" for i in range(12))
    assert {g.worker for g in got} == {"a", "b"}  # pulled by whichever had room, no static split
    assert all(s.policy_version == 0 and len(s.response_ids) == len(s.logprobs) for g in got for s in g.samples)
    assert r.xpending(keys.RunKeys(RUN).prompts, "rollout")["pending"] == 0
    assert {k.decode(): int(v) for k, v in r.hgetall(keys.RunKeys(RUN).weight_versions).items()} == {"a": 0, "b": 0}


def test_groups_wait_for_their_version_and_stale_ones_are_skipped(r, tiny_model_dir, tmp_path):
    w = make_worker(r, tiny_model_dir, tmp_path, "w")
    publish_weights(r, tmp_path, w.engine, 0)
    publish_weights(r, tmp_path, w.engine, 1)
    w.poll()
    assert w.engine.version == 1  # caught up to the newest announced version directly
    publish_prompts(r, 1, version=0, step=0)  # stale
    publish_prompts(r, 1, version=2, step=2)  # needs weights not published yet
    for _ in range(5):
        w.poll()
    assert rollouts(r) == [] and w.stale_prompts == 1 and len(w._held) == 1
    publish_weights(r, tmp_path, w.engine, 2)
    drive([w], lambda: len(rollouts(r)) == 1)
    assert rollouts(r)[0].prompt.group_id == "2:00000" and rollouts(r)[0].samples[0].policy_version == 2
    assert StepStore(r, RUN).served_versions() == {"w": 2}  # the one channel the version barrier reads


def test_an_idle_worker_takes_over_a_straggling_group(r, tiny_model_dir, tmp_path):
    slow = make_worker(r, tiny_model_dir, tmp_path, "slow")
    fast = make_worker(r, tiny_model_dir, tmp_path, "fast", straggler_seconds=0.5)
    publish_weights(r, tmp_path, slow.engine, 0)
    publish_prompts(r, 1, max_tokens=20)
    slow.sync_weights()
    slow.admit()  # slow has the group in its engine and then stalls
    assert len(slow._work) == 1
    fast.poll()
    assert rollouts(r) == []  # not yet a straggler
    time.sleep(0.6)
    drive([fast], lambda: len(rollouts(r)) == 1)
    assert rollouts(r)[0].worker == "fast" and fast.stolen == 1
    while slow._work:  # the straggler finishes its copy: it is dropped, not published twice
        slow.poll()
    assert len(rollouts(r)) == 1
    assert r.xpending(keys.RunKeys(RUN).prompts, "rollout")["pending"] == 0


def test_a_new_version_drops_groups_still_in_flight_at_the_old_one(r, tiny_model_dir, tmp_path):
    w = make_worker(r, tiny_model_dir, tmp_path, "w")
    publish_weights(r, tmp_path, w.engine, 0)
    publish_prompts(r, 1, max_tokens=50)
    w.sync_weights()
    w.admit()
    assert len(w._work) == 1
    publish_weights(r, tmp_path, w.engine, 1)
    w.poll()
    assert w.engine.version == 1 and not w._work and w.engine.in_flight() == []
    assert rollouts(r) == [] and r.xpending(keys.RunKeys(RUN).prompts, "rollout")["pending"] == 0


def test_with_bounded_staleness_any_version_of_the_window_generates_and_a_newer_one_loads_between_groups(r, tiny_model_dir, tmp_path):
    """max_staleness s = 1: a group of step 2 (version 2) is generated at once by a worker serving
    version 1; version 2, announced while it is in flight, is loaded once it is done (its samples
    keep version 1), new groups wait meanwhile; a group older than its window is stale."""
    w = make_worker(r, tiny_model_dir, tmp_path, "w")
    publish_weights(r, tmp_path, w.engine, 0)
    publish_weights(r, tmp_path, w.engine, 1)
    w.poll()
    publish_prompts(r, 1, version=2, step=2, max_tokens=40, max_staleness=1)
    w.admit()
    assert len(w._work) == 1  # version 1 is in the window 1-2 of step 2
    publish_weights(r, tmp_path, w.engine, 2)
    publish_prompts(r, 1, version=3, step=3, max_staleness=1)  # window 2-3: waits for version 2
    w.poll()
    assert w.engine.version == 1 and w._deferred_load == 2 and len(w._work) == 1  # the group in flight is not superseded
    drive([w], lambda: len(rollouts(r)) == 2)
    first, second = rollouts(r)
    assert first.prompt.group_id == "2:00000" and {s.policy_version for s in first.samples} == {1}
    assert second.prompt.group_id == "3:00000" and {s.policy_version for s in second.samples} == {2}
    assert w.engine.version == 2 and w._deferred_load is None and StepStore(r, RUN).served_versions() == {"w": 2}
    publish_prompts(r, 1, version=1, step=1, max_staleness=0)  # window 1-1: older than the weights served
    for _ in range(3):
        w.poll()
    assert len(rollouts(r)) == 2 and w.stale_prompts == 1
    assert r.xpending(keys.RunKeys(RUN).prompts, "rollout")["pending"] == 0


def test_a_worker_started_late_reads_weights_from_the_newest_announcement(r, tiny_model_dir, tmp_path):
    """Older versions are garbage-collected on a long run: a (re)started worker must not wait on
    them (it used to read `weights` from its start and retry each deleted version)."""
    import shutil

    first = make_worker(r, tiny_model_dir, tmp_path, "first")
    for v in range(4):
        publish_weights(r, tmp_path, first.engine, v)
    for v in range(3):
        shutil.rmtree(tmp_path / "weights" / f"v{v:06d}", ignore_errors=True)
    r.xadd(keys.RunKeys(RUN).weights, {b"type": b"WeightUpdate", b"pb": b"\xff garbage after the newest"})
    late = make_worker(r, tiny_model_dir, tmp_path, "late")
    started = time.monotonic()
    late.poll()
    assert late.engine.version == 3 and late._weight_failures == 0 and time.monotonic() - started < 5
    assert StepStore(r, RUN).served_versions() == {"late": 3}
    dead = Stream(r, keys.RunKeys(RUN).dead_of("rollout")).read_after("0", pb.DeadLetter)
    assert len(dead) == 1 and "poison" in dead[0][1].reason
