"""The on-policy step barrier: one thread per active run, read like the paper's outer loop.

    [estimate]  offline difficulty estimation (§6), if the run asks for it: N samples of every
                prompt with policy version 0; prompts solved 0/N or N/N are dropped
    for k = 0, 1, 2, ...
        at a stage boundary: end the stage (its step count or plateau rule), start the next one
                 with online filtering (prompts solved in every sample during the previous
                 stage are dropped), or finish / wait for a stage when the plan is done
        wait until every live rollout worker serves policy version k      (publish)
        publish D_R prompt groups tagged (step k, version k, the stage's T, gs, tau)
        wait for the learner's StepCompleted(k): it trained and published k+1   (rollout)
        wait until every live rollout worker serves version k + 1          (sync)
        record step k's figures (learner metrics + phase timings) in Redis and the JSONL log

Restarts. The barrier position (step k, phase) lives in the run's state hash and moves only in
the MULTI/EXEC transaction that performs the phase's effect: the prompts of step k are
published together with `phase = rollout`, and step k's record is appended together with
`step = k + 1, phase = publish` and the acknowledgement of StepCompleted(k). A controller killed
at any point (SIGKILL included) and started again therefore re-publishes a step only if it was
never published, never publishes a completed step again, and records each step exactly once.
StepCompleted events stay pending in the controller's consumer group until recorded, so a
restarted controller reads them again. Stage starts (with their filtering) are one transaction
too, and estimation results are stored per prompt (idempotent) before being acknowledged.

Online filtering reads the `scored` stream with the controller's own consumer group (the
learner's group is untouched): per prompt and stage, a hash remembers whether every sample of
every group of the prompt was correct. At the next stage's start those prompts are dropped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass

import redis

from magic.common import codec, faults, keys, metrics as m
from magic.common.bus import ConsumerGroup, is_retryable
from magic.common.config import ControllerSettings, RunSpec, StageConfig
from magic.common.heartbeat import alive_workers
from magic.common.pb import messages_pb2 as pb
from magic.common.retention import Retention
from magic.common.steps import ESTIMATION, StepStore, event_problem
from magic.controller.datasets import DatasetError, DatasetRegistry, PromptRecord, PromptSource
from magic.controller.store import Phase, RunStatus, RunStore, finite
from magic.controller.stream_metrics import StreamSampler

log = logging.getLogger(__name__)

GROUP = keys.CONTROLLER_GROUP
CONSUMER = "controller"  # one controller per deployment: a restarted one re-reads what its predecessor left pending


class RunFailed(RuntimeError):
    """The run cannot go on; the message is shown in its status."""


class Stopped(Exception):
    """A user asked the run to stop."""


class Shutdown(Exception):
    """The controller process is shutting down (or lost the run's lease to another controller);
    the run's state stays as it is."""


_RENEW = """
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
if not holder then redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


def group_seed(run_seed: int, step: int, index: int) -> int:
    digest = hashlib.sha256(f"{run_seed}:{step}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def load_pool(registry: DatasetRegistry, names: list[str]) -> list[PromptRecord]:
    """The records of the run's datasets, each uid once, in dataset order."""
    seen: set[str] = set()
    out = []
    for name in names:
        for rec in registry.load(name):
            if rec.uid not in seen:
                seen.add(rec.uid)
                out.append(rec)
    return out


def stage_end_reason(stage: StageConfig, done: list[dict]) -> str | None:
    """Why a stage whose finished steps have the records `done` ends now, or None if it goes on."""
    if len(done) >= stage.steps:
        return "steps"
    rule = stage.plateau
    if rule is None or len(done) < max(rule.min_steps, 2 * rule.window):
        return None
    values = [r.get(rule.metric) for r in done[-2 * rule.window:]]
    if any(v is None for v in values):
        return None
    prev, last = values[: rule.window], values[rule.window:]
    if sum(last) / rule.window - sum(prev) / rule.window < rule.min_delta:
        return "plateau"
    return None


@dataclass
class CurrentStage:
    index: int
    config: StageConfig
    start: int  # first global step of the stage
    source: PromptSource


class StepDriver(threading.Thread):
    """Drives one run's steps until its plan is done, it is stopped, or something fails."""

    def __init__(self, r: redis.Redis, run_id: str, settings: ControllerSettings, store: RunStore):
        super().__init__(name=f"driver-{run_id}", daemon=True)
        self.r = r
        self.run_id = run_id
        self.settings = settings
        self.store = store
        self.keys = keys.RunKeys(run_id)
        self.steps = StepStore(r, run_id)
        self.armed = settings.armed_faults
        self.shutdown = threading.Event()
        self.wake = threading.Event()  # set by the API after a request, to react at once
        self.stream_sampler = StreamSampler(r, run_id)
        self.retention = Retention(r, run_id, settings.filter_group, enabled=settings.trim_streams)
        self._stage: CurrentStage | None = None
        self.instance = f"{settings.worker_name}-{uuid.uuid4().hex[:8]}"
        self._lease_ms = int(settings.lease_seconds * 1000)
        self._renewed = 0.0

    # -- thread ------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            if self._acquire_lease():
                self.retention.start()  # trims acknowledged entries while the run is driven
                self._run()
        finally:
            self.retention.stop()
            try:
                self.r.eval(_RELEASE, 1, self.keys.lease, self.instance)
            except redis.RedisError:
                pass

    def _acquire_lease(self) -> bool:
        """Wait until this driver holds the run's lease (a dead controller's expires)."""
        logged = False
        while not self.shutdown.is_set():
            try:
                if self.r.set(self.keys.lease, self.instance, nx=True, px=self._lease_ms):
                    self._renewed = time.monotonic()
                    return True
                if self.store.status(self.run_id) in (RunStatus.finished, RunStatus.failed, RunStatus.stopped):
                    return False
                if not logged:
                    holder = self.r.get(self.keys.lease)
                    log.warning("run %s is driven by %s; waiting for its lease to expire", self.run_id, holder.decode() if holder else "?")
                    logged = True
            except redis.RedisError as exc:
                if not is_retryable(exc):
                    raise
                log.warning("run %s: Redis unavailable (%s)", self.run_id, exc)
            self.shutdown.wait(0.2)
        return False

    def _renew_lease(self) -> None:
        now = time.monotonic()
        if now - self._renewed < self._lease_ms / 3000:
            return
        if not self.r.eval(_RENEW, 1, self.keys.lease, self.instance, self._lease_ms):
            raise Shutdown(f"lost the lease of run {self.run_id} to another controller")
        self._renewed = now

    def _run(self) -> None:
        while True:
            try:
                finished = self.drive()
                self.stream_sampler.sample()  # the streams' final state: throttled samples may predate the last steps
                self.store.finish(self.run_id, RunStatus.finished if finished else RunStatus.stopped)
                log.info("run %s %s", self.run_id, "finished" if finished else "stopped")
                return
            except Shutdown as exc:
                log.info("run %s: %s; the run's state is kept", self.run_id, exc if str(exc) else "controller shutting down")
                return
            except Stopped:
                self.store.finish(self.run_id, RunStatus.stopped)
                log.info("run %s stopped", self.run_id)
                return
            except Exception as exc:  # noqa: BLE001 — Redis restarting or refusing: resume from the persisted state
                if not is_retryable(exc):
                    self._fail(exc)
                    return
                log.warning("run %s: lost Redis (%s); resuming from the persisted state", self.run_id, exc)
                if self.shutdown.wait(2.0):
                    return

    def _fail(self, exc: Exception) -> None:
        """Any failure that is not a Redis outage ends the run with its reason."""
        log.error("run %s failed", self.run_id, exc_info=exc)
        try:
            self.store.finish(self.run_id, RunStatus.failed, error=f"{type(exc).__name__}: {exc}")
        except redis.RedisError:
            log.exception("run %s: cannot record the failure", self.run_id)

    # -- the loop ----------------------------------------------------------------------------

    def drive(self) -> bool:
        """Run steps until the plan is done (True) or a stop is requested (False)."""
        self._open_consumers()
        self._stage = None
        spec = self._spec()
        try:
            pool = load_pool(DatasetRegistry(self.r), spec.datasets)
        except DatasetError as exc:
            raise RunFailed(str(exc)) from None
        self.store.sync_jsonl(self.run_id)
        state = self.store.state(self.run_id)
        k, phase = int(state.get("step", 0)), Phase(state.get("phase", Phase.publish.value))
        self.store.update(self.run_id, started_at=state.get("started_at") or time.time())
        if phase is Phase.estimate:
            self.store.update(self.run_id, status=RunStatus.estimating)
            self.estimate(spec, pool, k)
            phase = Phase.publish
        self.store.update(self.run_id, status=RunStatus.running)
        while True:
            self._check_control(allow_pause=phase is Phase.publish)
            if phase is Phase.publish:
                stage = self.stage_for(k, pool)
                if stage is None:
                    if self._spec().on_plan_end == "finish":
                        return True
                    self._wait_for_stage()
                    continue
                m.STAGE.set(stage.index)
                m.CONTEXT_LENGTH.set(stage.config.context_length)
                m.STEP.set(k)
                self.wait_for_version(k, allow_pause=True)
                self._check_control(allow_pause=True)
                self.publish_step(k, stage)
                phase = Phase.rollout
            if phase is Phase.rollout:
                self.wait_for_step(k)
                faults.point(self.armed, "controller.completed", k)
                phase = Phase.sync
                self.store.update(self.run_id, phase=phase)
            if phase is Phase.sync:
                synced_at = self.wait_for_version(k + 1)
                self.record_step(k, synced_at)
                k, phase = k + 1, Phase.publish

    def _spec(self) -> RunSpec:
        spec = self.store.spec(self.run_id)
        if spec is None:
            raise RunFailed("the run's spec is gone from Redis")
        return spec

    def _open_consumers(self) -> None:
        mk = lambda stream, group: ConsumerGroup(  # noqa: E731
            self.r, stream, group, CONSUMER, dead_stream=self.keys.dead, max_deliveries=self.settings.max_deliveries
        )
        self.events = mk(self.keys.events, GROUP)
        self.scored = mk(self.keys.scored, self.settings.filter_group)
        self.estimates = mk(self.keys.estimates, GROUP)
        for c in (self.events, self.scored, self.estimates):
            c.ensure()
        self._completed: dict[int, tuple[str, pb.StepCompleted]] = {}

    # -- control: pause, resume, stop, shutdown ------------------------------------------------

    def _check_control(self, allow_pause: bool = False) -> None:
        if self.shutdown.is_set():
            raise Shutdown()
        self._renew_lease()
        requested = self.store.requested(self.run_id)
        if "stop" in requested:
            raise Stopped()
        if allow_pause and "pause" in requested:
            self.store.update(self.run_id, status=RunStatus.paused)
            log.info("run %s paused", self.run_id)
            while "pause" in (requested := self.store.requested(self.run_id)):
                if "stop" in requested:
                    raise Stopped()
                if self.shutdown.is_set():
                    raise Shutdown()
                self._check_events()
                self.wake.wait(0.2)
                self.wake.clear()
            self.store.update(self.run_id, status=RunStatus.running)
            log.info("run %s resumed", self.run_id)

    def _wait_for_stage(self) -> None:
        """The plan is done and the run waits: return once a stage was appended."""
        self.store.update(self.run_id, status=RunStatus.waiting)
        stages = len(self._spec().stages)
        log.info("run %s: plan done after %d stages; waiting for the next stage", self.run_id, stages)
        while len(self._spec().stages) == stages:
            self._check_control()
            self._check_events()
            self.wake.wait(0.2)
            self.wake.clear()
        self.store.update(self.run_id, status=RunStatus.running)

    # -- stages and online filtering -----------------------------------------------------------

    def stage_for(self, k: int, pool: list[PromptRecord]) -> CurrentStage | None:
        """The stage step k belongs to, starting the next stage (with online filtering) when the
        current one has ended; None when the plan has no stage left."""
        spec = self._spec()
        state = self.store.state(self.run_id)
        index, start = int(state.get("stage", -1)), int(state.get("stage_start", 0))
        if index >= 0:
            stage = spec.stages[index]
            reason = stage_end_reason(stage, self.store.metrics(self.run_id, since=start))
            if reason is None:
                if self._stage is None or self._stage.index != index:
                    self._stage = CurrentStage(index, stage, start, self._source(spec, index, pool))
                return self._stage
        else:
            reason = None
        if index + 1 >= len(spec.stages):
            if index >= 0:
                self._end_stage_record(index, k, reason)
            return None
        return self._start_stage(spec, index + 1, k, reason, pool)

    def _end_stage_record(self, index: int, k: int, reason: str | None) -> None:
        rec = json.loads(self.r.lindex(self.keys.stages, index))
        if rec.get("end_step") is None:
            rec.update(end_step=k, end_reason=reason)
            self.r.lset(self.keys.stages, index, json.dumps(rec))

    def _start_stage(self, spec: RunSpec, index: int, k: int, prev_reason: str | None, pool: list[PromptRecord]) -> CurrentStage:
        stage = spec.stages[index]
        self._drain_scored()  # every scored group of the previous stage is in (its last step completed)
        dropped = self._dropped()
        newly: list[str] = []
        if index > 0 and stage.online_filter:
            solved = self.r.hgetall(self.keys.solved(index - 1))
            newly = sorted(u.decode() for u, v in solved.items() if v == b"1" and u.decode() not in dropped)
        gone = set(dropped) | set(newly)
        remaining = sum(1 for rec in pool if rec.uid not in gone)
        if remaining == 0:
            raise RunFailed(f"stage {stage.name!r}: no prompts left ({len(pool)} in the datasets, all dropped by filtering)")
        record = {
            "index": index,
            "name": stage.name,
            "context_length": stage.context_length,
            "start_step": k,
            "end_step": None,
            "end_reason": None,
            "prompts": remaining,
            "dropped_online": len(newly),
            "dropped_total": len(dropped) + len(newly),
            "started_at": time.time(),
        }
        pipe = self.r.pipeline(transaction=True)
        for uid in newly:
            pipe.hset(self.keys.dropped, uid, json.dumps({"from_stage": index, "reason": "solved"}))
        if index > 0:
            prev = json.loads(self.r.lindex(self.keys.stages, index - 1))
            prev.update(end_step=k, end_reason=prev_reason)
            pipe.lset(self.keys.stages, index - 1, json.dumps(prev))
        pipe.rpush(self.keys.stages, json.dumps(record))
        pipe.hset(self.keys.state, mapping={"stage": index, "stage_start": k})
        pipe.execute()
        log.info(
            "run %s: stage %d '%s' starts at step %d (T=%d, D_R=%d, gs=%d): %d prompts, %d dropped by online filtering",
            self.run_id, index, stage.name, k, stage.context_length, stage.rollout_batch_size, stage.group_size, remaining, len(newly),
        )
        self._stage = CurrentStage(index, stage, k, self._source(spec, index, pool))
        return self._stage

    def _dropped(self) -> dict[str, dict]:
        return {u.decode(): json.loads(v) for u, v in self.r.hgetall(self.keys.dropped).items()}

    def _source(self, spec: RunSpec, index: int, pool: list[PromptRecord]) -> PromptSource:
        """Stage `index`'s prompts: the pool less what was dropped from this stage on."""
        dropped = {u for u, d in self._dropped().items() if d["from_stage"] <= index}
        return PromptSource([rec for rec in pool if rec.uid not in dropped], spec.seed * 1009 + index)

    def _drain_scored(self) -> None:
        while self._read_scored(block_ms=0) > 0:
            pass

    def _read_scored(self, block_ms: int = 0) -> int:
        """Record per-prompt outcomes of scored groups: all samples correct or not, per stage."""
        entries = self.scored.read(count=500, block_ms=block_ms or None)
        if not entries:
            return 0
        pipe = self.r.pipeline(transaction=False)
        for entry in entries:
            try:
                group = codec.decode(entry.fields, pb.ScoredGroup)
            except codec.PoisonMessage:
                continue  # the learner dead-letters it; nothing to learn here
            prompt = group.rollout.prompt
            if not prompt.prompt_uid or not group.scores or self.steps.check_group(prompt) is not None:
                continue  # a group we did not publish (the learner dead-letters it) must not drop a prompt
            key = self.keys.solved(prompt.stage)
            if all(s.correctness >= 1.0 for s in group.scores):
                pipe.hsetnx(key, prompt.prompt_uid, 1)
            else:
                pipe.hset(key, prompt.prompt_uid, 0)
        pipe.execute()
        self.scored.ack(*(e.id for e in entries))
        return len(entries)

    # -- offline difficulty estimation ---------------------------------------------------------

    def estimate(self, spec: RunSpec, pool: list[PromptRecord], k: int) -> None:
        """Sample every prompt N times with policy version k (N per data source:
        `EstimationConfig.samples_for`), store per-prompt pass rates and drop the prompts solved
        0/N or N/N. Resumable: what was published and received is in Redis."""
        cfg = spec.estimation
        assert cfg is not None
        prompts = pool[: cfg.max_prompts] if cfg.max_prompts else pool
        total = len(prompts)
        self.r.hsetnx(self.keys.estimation, "status", "running")
        self.r.hset(self.keys.estimation, mapping={"prompts": total, "samples": cfg.samples})
        deadline = time.monotonic() + self.settings.step_timeout_seconds
        log.info("run %s: difficulty estimation of %d prompts, N=%d, T=%d", self.run_id, total, cfg.samples, cfg.context_length)
        while True:
            self._check_control()
            self._read_estimates()
            received = int(self.r.hlen(self.keys.pass_rates))
            if received >= total:
                break
            published = int(self.r.hget(self.keys.estimation, "published") or 0)
            if published < total and published - received < cfg.groups_per_batch:
                self.wait_for_version(k)
                batch = prompts[published: published + cfg.groups_per_batch]
                groups = [
                    self._group(rec, f"est:{i:07d}", k, -1, pb.GROUP_KIND_ESTIMATE, cfg.samples_for(rec.data_source), cfg.temperature, 1.0, cfg.context_length, group_seed(spec.seed, -1, i))
                    for i, rec in enumerate(batch, published)
                ]
                pipe = self.r.pipeline(transaction=True)
                self.steps.publish_groups(pipe, ESTIMATION, groups)
                pipe.hset(self.keys.estimation, "published", published + len(batch))
                pipe.execute()
            if time.monotonic() > deadline:
                raise RunFailed(f"difficulty estimation: {received}/{total} prompts scored after {self.settings.step_timeout_seconds:.0f}s")
        rates = {u.decode(): v.decode() for u, v in self.r.hgetall(self.keys.pass_rates).items()}
        dropped = self._dropped()
        pipe = self.r.pipeline(transaction=True)
        counts = {"estimated_0": 0, "estimated_all": 0}
        for uid, rate in rates.items():
            correct, n = (int(x) for x in rate.split("/"))
            reason = "estimated_0" if correct == 0 else "estimated_all" if correct == n else None
            if reason:
                counts[reason] += 1
                if uid not in dropped:
                    pipe.hset(self.keys.dropped, uid, json.dumps({"from_stage": 0, "reason": reason}))
        pipe.hset(self.keys.estimation, mapping={"status": "done", "received": len(rates), "dropped_0": counts["estimated_0"], "dropped_all": counts["estimated_all"]})
        pipe.hset(self.keys.state, "phase", Phase.publish.value)
        pipe.execute()
        log.info("run %s: estimation done: %d prompts solved 0/N, %d solved N/N dropped", self.run_id, counts["estimated_0"], counts["estimated_all"])

    def _read_estimates(self) -> None:
        self._check_events()
        entries = self.estimates.read(count=200, block_ms=200)
        for entry in entries:
            group = self.estimates.decode(entry, pb.ScoredGroup)
            if group is None:
                continue
            uid = group.rollout.prompt.prompt_uid
            correct = sum(1 for s in group.scores if s.correctness >= 1.0)
            self.r.hset(self.keys.pass_rates, uid, f"{correct}/{len(group.scores)}")  # idempotent
            self.estimates.ack(entry.id)

    # -- phases ------------------------------------------------------------------------------

    def _group(self, rec: PromptRecord, group_id: str, k: int, stage_index: int, kind: int, n: int, temperature: float, top_p: float, max_tokens: int, seed: int) -> pb.PromptGroup:
        group = pb.PromptGroup(
            run_id=self.run_id,
            group_id=group_id,
            step=k,
            policy_version=k,
            stage=max(stage_index, 0),
            data_source=rec.data_source,
            ground_truth=rec.ground_truth,
            extra_info_json=json.dumps(rec.extra_info) if rec.extra_info else "",
            prompt_uid=rec.uid,
            sampling=pb.SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed),
            published_at=time.time(),
            kind=kind,
        )
        for role, content in rec.messages:
            group.messages.add(role=role, content=content)
        return group

    def publish_step(self, k: int, stage: CurrentStage) -> None:
        """Publish step k's D_R prompt groups, tagged with version k and the stage's settings,
        and move the barrier to `rollout` in the same transaction."""
        cfg = self._spec().stages[stage.index]  # re-read: the driver never trains on a stale copy
        records = stage.source.take((k - stage.start) * cfg.rollout_batch_size, cfg.rollout_batch_size)
        seed = self._spec().seed
        groups = [
            self._group(rec, f"{k}:{i:05d}", k, stage.index, pb.GROUP_KIND_TRAIN, cfg.group_size, cfg.temperature, cfg.top_p, cfg.context_length, group_seed(seed, k, i))
            for i, rec in enumerate(records)
        ]
        if cfg.penalties is not None:  # the stage's penalties travel with each group to the reward service
            for group in groups:
                group.penalties_json = cfg.penalties.model_dump_json()
        pipe = self.r.pipeline(transaction=True)
        self.steps.publish_step(pipe, k, stage.index, cfg, groups)
        pipe.hset(self.keys.state, mapping={"phase": Phase.rollout.value, "stage": stage.index})
        pipe.execute()
        faults.point(self.armed, "controller.published", k)
        log.info("step %d (stage %d '%s', T=%d): published %d prompt groups", k, stage.index, cfg.name, cfg.context_length, len(records))

    def wait_for_version(self, version: int, allow_pause: bool = False) -> float:
        """Block until at least one rollout worker of this run serves `version` and none serves
        an older one; returns when that happened. A pause is honoured while waiting when
        `allow_pause` (nothing of the step is out yet)."""
        deadline = time.monotonic() + self.settings.worker_wait_seconds
        while True:
            self._check_events()
            workers = {n: s for n, s in alive_workers(self.r, "rollout").items() if s.get("run") == self.run_id}
            served = self.steps.served_versions()
            live = [served.get(n, -1) for n in workers]
            m.LIVE_WORKERS.labels(service="rollout").set(len(workers))
            if live and min(live) >= version:
                m.POLICY_VERSION.set(min(live))
                return time.time()
            self._check_control(allow_pause)
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
            self._check_control()
            if time.monotonic() > deadline:
                raise RunFailed(f"step {k} did not complete within {self.settings.step_timeout_seconds:.0f}s")
        return self._completed[k][1]

    def _check_events(self, block_ms: int = 0) -> None:
        """Consume control events: remember StepCompleted, fail on WorkerError; record the
        outcomes of scored groups for online filtering; sample the stream gauges."""
        self._renew_lease()
        self.stream_sampler.maybe_sample()
        self._read_scored()
        for entry in self.events.read(count=100, block_ms=block_ms or 1):
            event = self.events.decode(entry, pb.Event, check=self._event_problem)
            if event is None:
                continue
            kind = event.WhichOneof("kind")
            if kind == "step_completed":
                self._completed[event.step_completed.step] = (entry.id, event.step_completed)
                continue  # acknowledged once the step is recorded
            self.events.ack(entry.id)
            if kind == "worker_error":
                raise RunFailed(f"{event.worker_error.service} {event.source}: {event.worker_error.message}")

    def _event_problem(self, event: pb.Event) -> str | None:
        """Why `event` is refused, or None: a StepCompleted(k) counts only once the learner has
        committed step k (the same MULTI sends it), so a stray or forged one cannot move the barrier."""
        if (problem := event_problem(event, self.run_id)) is not None:
            return problem
        if event.WhichOneof("kind") == "step_completed" and event.step_completed.step > self.steps.last_trained():
            return f"StepCompleted({event.step_completed.step}) but the learner has committed step {self.steps.last_trained()} only"
        return None

    def record_step(self, k: int, synced_at: float) -> None:
        """Append step k's record and move the barrier to step k + 1, in one transaction."""
        entry_id, done = self._completed.pop(k)
        step = self.steps.record(k)
        stage = step.stage_config
        published_at = step.published_at or done.batch_complete_at
        rollout = max(0.0, done.batch_complete_at - published_at)
        train = done.train_seconds
        sync = max(0.0, synced_at - (done.batch_complete_at + train))
        total = max(rollout + train + sync, synced_at - published_at)
        record = finite({
            "step": k,
            "stage": step.stage,
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
        })
        if self.store.metrics_count(self.run_id) != k:
            raise RunFailed(f"step bookkeeping is inconsistent: recording step {k} but {self.store.metrics_count(self.run_id)} steps are recorded")
        pipe = self.r.pipeline(transaction=True)
        pipe.rpush(self.keys.metrics, json.dumps(record, sort_keys=True))
        pipe.hset(self.keys.state, mapping={"step": k + 1, "phase": Phase.publish.value, "policy_version": k + 1})
        pipe.xack(self.keys.events, GROUP, entry_id)
        pipe.execute()
        faults.point(self.armed, "controller.recorded", k)
        self.retention.release_step(k + 1)  # every entry of step k is acknowledged: drop it
        self.store.sync_jsonl(self.run_id)
        for phase in ("rollout", "train", "weight_sync", "other"):
            m.STEP_SECONDS.labels(phase=phase).set(record[f"step_seconds_{phase}"])
