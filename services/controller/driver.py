"""The on-policy step barrier: one thread per active run, read like the paper's outer loop.

    for k in steps of the plan (stages in order):
        wait until every live rollout worker serves policy version k      (publish)
        publish D_R prompt groups tagged (step k, version k, stage's T, gs, tau)
        wait for the learner's StepCompleted(k): it trained and published k+1   (rollout)
        wait until every live rollout worker serves version k + 1          (sync)
        record step k's figures (learner metrics + phase timings) in Redis and the JSONL log

The phase is persisted at each transition, so a restarted controller resumes the barrier where
it stopped: no step is published twice or skipped, and each step's record is written once.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time

import redis

from magic.common import codec, keys, metrics as m
from magic.common.bus import ConsumerGroup, Stream
from magic.common.config import ControllerSettings, RunSpec
from magic.common.heartbeat import alive_workers
from magic.common.pb import messages_pb2 as pb
from magic.controller.datasets import PromptSource, load_jsonl
from magic.controller.store import Phase, RunStatus, RunStore
from magic.controller.stream_metrics import StreamSampler

log = logging.getLogger(__name__)

GROUP = "controller"


class RunFailed(RuntimeError):
    pass


def group_seed(run_seed: int, step: int, index: int) -> int:
    digest = hashlib.sha256(f"{run_seed}:{step}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def prompt_position(spec: RunSpec, step: int) -> int:
    """How many prompts the steps before `step` consumed (the offset into the prompt stream)."""
    position, start = 0, 0
    for stage in spec.stages:
        position += stage.rollout_batch_size * min(stage.steps, max(0, step - start))
        start += stage.steps
    return position


class StepDriver(threading.Thread):
    """Drives one run's steps until its plan is done, it is stopped, or something fails."""

    def __init__(self, r: redis.Redis, run_id: str, settings: ControllerSettings, store: RunStore):
        super().__init__(name=f"driver-{run_id}", daemon=True)
        self.r = r
        self.run_id = run_id
        self.settings = settings
        self.store = store
        self.keys = keys.RunKeys(run_id)
        self.stop_requested = threading.Event()
        # one controller per deployment: a fixed consumer name lets a restarted controller
        # re-read the events its predecessor received but had not acknowledged
        self.events = ConsumerGroup(r, self.keys.events, GROUP, GROUP, dead_stream=self.keys.dead, max_deliveries=settings.max_deliveries)
        self.events.ensure()
        self.prompts = Stream(r, self.keys.prompts)
        self._completed: dict[int, tuple[str, pb.StepCompleted]] = {}
        self.stream_sampler = StreamSampler(r, run_id)

    def run(self) -> None:
        try:
            finished = self.drive()
            self.store.finish(self.run_id, RunStatus.finished if finished else RunStatus.stopped)
            log.info("run %s %s", self.run_id, "finished" if finished else "stopped")
        except Exception as exc:  # noqa: BLE001 — any failure ends the run with its reason
            log.exception("run %s failed", self.run_id)
            self.store.finish(self.run_id, RunStatus.failed, error=f"{type(exc).__name__}: {exc}")

    # -- the loop ----------------------------------------------------------------------------

    def drive(self) -> bool:
        """Run steps until the plan is done (True) or a stop is requested (False)."""
        spec = self.store.spec(self.run_id)
        assert spec is not None
        source = PromptSource([rec for path in spec.train_files for rec in load_jsonl(path)], spec.seed)
        state = self.store.state(self.run_id)
        k, phase = int(state.get("step", 0)), Phase(state.get("phase", Phase.publish.value))
        self.store.update(self.run_id, status=RunStatus.running, started_at=state.get("started_at") or time.time())
        while not self.stop_requested.is_set():
            spec = self.store.spec(self.run_id)  # stages may have been appended
            if k >= spec.total_steps:
                return True
            stage_index, stage = spec.stage_at(k)
            m.STAGE.set(stage_index)
            m.CONTEXT_LENGTH.set(stage.context_length)
            m.STEP.set(k)
            if phase is Phase.publish:
                self.wait_for_version(k)
                self.publish_step(spec, k, source)
                phase = Phase.rollout
                self.store.update(self.run_id, phase=phase, stage=stage_index)
            if phase is Phase.rollout:
                self.wait_for_step(k)
                phase = Phase.sync
                self.store.update(self.run_id, phase=phase)
            if phase is Phase.sync:
                synced_at = self.wait_for_version(k + 1)
                self.record_step(spec, k, synced_at)
                k, phase = k + 1, Phase.publish
                self.store.update(self.run_id, step=k, phase=phase, policy_version=k)
        return False

    # -- phases ------------------------------------------------------------------------------

    def publish_step(self, spec: RunSpec, k: int, source: PromptSource) -> None:
        """Publish step k's D_R prompt groups, tagged with version k and the stage's settings."""
        stage_index, stage = spec.stage_at(k)
        records = source.take(prompt_position(spec, k), stage.rollout_batch_size)
        now = time.time()
        self.r.hset(self.keys.step(k), mapping={"expected": len(records), "stage": stage_index, "published_at": now})
        pipe = self.r.pipeline(transaction=True)
        for i, rec in enumerate(records):
            group = pb.PromptGroup(
                run_id=self.run_id,
                group_id=f"{k}:{i:05d}",
                step=k,
                policy_version=k,
                stage=stage_index,
                data_source=rec.data_source,
                ground_truth=rec.ground_truth,
                prompt_uid=rec.uid,
                sampling=pb.SamplingParams(
                    n=stage.group_size,
                    temperature=stage.temperature,
                    top_p=stage.top_p,
                    max_tokens=stage.context_length,
                    seed=group_seed(spec.seed, k, i),
                ),
                published_at=now,
            )
            for role, content in rec.messages:
                group.messages.add(role=role, content=content)
            pipe.xadd(self.prompts.key, codec.encode(group))
        pipe.execute()
        log.info("step %d (stage %d '%s', T=%d): published %d prompt groups", k, stage_index, stage.name, stage.context_length, len(records))

    def wait_for_version(self, version: int) -> float:
        """Block until at least one rollout worker of this run serves `version` and none serves
        an older one; returns when that happened."""
        deadline = time.monotonic() + self.settings.worker_wait_seconds
        while True:
            self._check_events()
            workers = {n: s for n, s in alive_workers(self.r, "rollout").items() if s.get("run") == self.run_id}
            served = {n: int(v) for n, v in ((k.decode(), v) for k, v in self.r.hgetall(self.keys.weight_versions).items())}
            live = [served.get(n, -1) for n in workers]
            m.LIVE_WORKERS.labels(service="rollout").set(len(workers))
            if live and min(live) >= version:
                m.POLICY_VERSION.set(min(live))
                return time.time()
            if self.stop_requested.is_set():
                raise RunFailed("stopped while waiting for rollout workers")
            if time.monotonic() > deadline:
                raise RunFailed(
                    f"no rollout worker serves policy version {version} after {self.settings.worker_wait_seconds:.0f}s "
                    f"(live workers and versions: { {n: served.get(n, -1) for n in workers} })"
                )
            time.sleep(0.05)

    def wait_for_step(self, k: int) -> pb.StepCompleted:
        deadline = time.monotonic() + self.settings.step_timeout_seconds
        while k not in self._completed:
            self._check_events(block_ms=200)
            if self.stop_requested.is_set():
                raise RunFailed("stopped while waiting for the learner")
            if time.monotonic() > deadline:
                raise RunFailed(f"step {k} did not complete within {self.settings.step_timeout_seconds:.0f}s")
        return self._completed[k][1]

    def _check_events(self, block_ms: int = 0) -> None:
        """Consume control events: remember StepCompleted, fail on WorkerError."""
        self.stream_sampler.maybe_sample()
        for entry in self.events.read(count=100, block_ms=block_ms or 1):
            event = self.events.decode(entry, pb.Event)
            if event is None:
                continue
            kind = event.WhichOneof("kind")
            if kind == "step_completed":
                self._completed[event.step_completed.step] = (entry.id, event.step_completed)
                continue  # acknowledged once the step is recorded
            self.events.ack(entry.id)
            if kind == "worker_error":
                raise RunFailed(f"{event.worker_error.service} {event.source}: {event.worker_error.message}")

    def record_step(self, spec: RunSpec, k: int, synced_at: float) -> None:
        entry_id, done = self._completed.pop(k)
        stage_index, stage = spec.stage_at(k)
        published_at = float(self.r.hget(self.keys.step(k), "published_at") or done.batch_complete_at)
        rollout = max(0.0, done.batch_complete_at - published_at)
        train = done.train_seconds
        sync = max(0.0, synced_at - (done.batch_complete_at + train))
        total = max(rollout + train + sync, synced_at - published_at)
        record = {
            "step": k,
            "stage": stage_index,
            "stage_name": stage.name,
            "context_length": stage.context_length,
            "policy_version": k,
            "time": synced_at,
            **dict(done.metrics),
            "step_seconds_rollout": rollout,
            "step_seconds_train": train,
            "step_seconds_weight_sync": sync,
            "step_seconds_other": max(0.0, total - rollout - train - sync),
            "step_seconds_total": total,
        }
        self.store.append_metrics(self.run_id, record)
        for phase in ("rollout", "train", "weight_sync", "other"):
            m.STEP_SECONDS.labels(phase=phase).set(record[f"step_seconds_{phase}"])
        self.events.ack(entry_id)
