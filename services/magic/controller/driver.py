"""The on-policy step barrier: one thread per active run, read like the paper's outer loop.

    [estimate]  offline difficulty estimation (§6), if the run asks for it: N samples of every
                prompt with policy version 0; prompts solved 0/N or N/N are dropped
    for k = 0, 1, 2, ...
        at a stage boundary: end the stage (its step count or plateau rule), start the next one
                 with online filtering (prompts solved in every sample during the previous
                 stage are dropped), or finish / wait for a stage when the plan is done
        wait until every live rollout worker serves policy version k      (publish)
        [validate]  every `validation.every` steps: held-out figures of version k (validation.py)
        [evals]     requested evaluations (POST /v1/runs/{run}/evals) of version k; while the
                    run is paused or waits for a stage they are served at once
        publish D_R prompt groups tagged (step k, version k, the stage's T, gs, tau)
            (with a checkpoint request when a stage just ended or version k validated best yet;
            nothing to do if step k was published ahead)
        wait for the learner's StepCompleted(k): it trained and published k+1   (rollout)
        wait until every live rollout worker serves version k + 1          (sync)
            [ahead]  meanwhile, with bounded staleness (the stage's max_staleness s >= 1, off-
                     policy by at most s versions): publish steps k+1 ... k+s, step j once every
                     live worker serves version j - s, its samples from versions j - s ... j;
                     never across a stage boundary, a validation or a requested evaluation
                     (`_publish_ahead`)
        record step k's figures (learner metrics + phase timings) in Redis and the JSONL log

Restarts. The barrier position (step k, phase) lives in the run's state hash and moves only in
the MULTI/EXEC transaction that performs the phase's effect: the prompts of step k are
published together with `phase = rollout`, and step k's record is appended together with
`step = k + 1, phase = publish` and the acknowledgement of StepCompleted(k). A controller killed
at any point (SIGKILL included) and started again therefore re-publishes a step only if it was
never published, never publishes a completed step again, and records each step exactly once.
StepCompleted events stay pending in the controller's consumer group until recorded, so a
restarted controller reads them again. Every write is a `RunStore` (run state) or `StepStore`
(the step contract) call, in the run store's transactions where the barrier moves.

The driver's other roles live next to it: the run lease (`lease.py`), stages and online filtering
(`plan.py`), and the side jobs (`sidejobs.py`: one interface, run by `_run_side_job` at a step
boundary, their scored groups routed by kind) — offline difficulty estimation (`estimation.py`),
held-out validation and requested evaluations (`validation.py`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

from magic.config.schema import RunSpec
from magic.controller.datasets import DatasetError, DatasetRegistry, group_seed, load_pool, prompt_group
from magic.controller.errors import RunFailed
from magic.controller.estimation import DifficultyEstimation
from magic.controller.events import EventInbox
from magic.controller.plan import CurrentStage, StagePlan, may_end
from magic.controller.settings import ControllerSettings
from magic.controller.sidejobs import SideJob, SideJobs
from magic.controller.stream_metrics import StreamSampler
from magic.controller.validation import EVAL_OPEN, EvaluationTimeout, Validation, best
from magic.observability import metrics as m
from magic.protocol import keys
from magic.protocol.pb import messages_pb2 as pb
from magic.protocol.status import TERMINAL, Phase, RunStatus
from magic.runtime import faults
from magic.runtime.liveness import LoopWatch
from magic.store.client import RedisError, is_retryable, run_gone
from magic.store.lease import LeaseLost, RedisLostData, RunEnded
from magic.store.runs import Runs, finite

log = logging.getLogger(__name__)

GROUP = keys.CONTROLLER_GROUP

LOST_DATA_ADVICE = (
    "The run cannot go on exactly: restore Redis from a backup taken after its last recorded step, or start a new run "
    "from its newest checkpoint (data/runs/<run>/checkpoints); Redis with appendfsync always loses no acknowledged write "
    "(docs/architecture.md, \"Persistence\")"
)


class Stopped(Exception):
    """A user asked the run to stop."""


class Shutdown(Exception):
    """The controller process is shutting down (or lost the run's lease to another controller);
    the run's state stays as it is."""


class StepDriver(threading.Thread):
    """Drives one run's steps until its plan is done, it is stopped, or something fails."""

    def __init__(self, runs: Runs, datasets: DatasetRegistry, run_id: str, settings: ControllerSettings):
        super().__init__(name=f"driver-{run_id}", daemon=True)
        self.run_id = run_id
        self.settings = settings
        self.datasets = datasets
        self.holder = f"{settings.worker_name}-{uuid.uuid4().hex[:8]}"
        self.lease = runs.lease(run_id, self.holder, settings.lease_seconds)
        # every write of the driver is made under its lease: a driver that lost it writes nothing
        self.store = runs.store(run_id, writer=self.lease)
        self.channels = runs.channels(run_id, self.holder, settings.max_deliveries, fence=self.lease, heartbeat_ttl=settings.heartbeat_ttl_seconds)
        self.steps = self.channels.steps
        self.armed = settings.armed_faults
        self.shutdown = threading.Event()
        self.wake = threading.Event()  # set by the API after a request, to react at once
        self.stream_sampler = StreamSampler(self.channels)
        self.retention = self.store.retention(settings.filter_group, enabled=settings.trim_streams)
        self.watch = LoopWatch(settings.liveness_stall_seconds)  # the controller's /livez: `Controller.stalled`

    # -- thread ------------------------------------------------------------------------------

    def run(self) -> None:
        """Hold the run's lease and drive it; a driver that loses the lease (paused past it, cut
        off from Redis) stands by and drives again once it holds a new lease."""
        try:
            while not self.shutdown.is_set():
                try:
                    with self.watch.allowing(float("inf"), "standing by for the lease"):  # acquire() waits in a bounded loop
                        if not self.lease.acquire(self.shutdown, given_up=lambda: self.store.status() in TERMINAL):
                            return
                except RedisLostData as exc:
                    self._fail(exc)
                    return
                self.retention.start()  # trims acknowledged entries while the run is driven
                try:
                    if self._run():
                        return
                finally:
                    self.retention.stop()
                log.warning("run %s: %s lost the lease; standing by", self.run_id, self.holder)
        finally:
            self.lease.release()

    def _renew_lease(self) -> None:
        """Every waiting loop of the driver comes through here: it is also the driver's beat."""
        self.watch.beat()
        if not self.lease.renew():
            raise LeaseLost(f"run {self.run_id}: the controller lease of {self.holder} was lost (now {self.lease.holder_now() or 'nobody'})")

    def _run(self) -> bool:
        """Drive until the run ends (True) or the lease is lost (False)."""
        while True:
            try:
                finished = self.drive()
                self.stream_sampler.sample()  # the streams' final state: throttled samples may predate the last steps
                faults.point(self.armed, "controller.finishing", self.store.metrics_count())
                self.store.finish(RunStatus.finished if finished else RunStatus.stopped)
                log.info("run %s %s", self.run_id, "finished" if finished else "stopped")
                return True
            except Shutdown as exc:
                log.info("run %s: %s; the run's state is kept", self.run_id, exc if str(exc) else "controller shutting down")
                return True
            except Stopped:
                self.store.finish(RunStatus.stopped)
                log.info("run %s stopped", self.run_id)
                return True
            except LeaseLost as exc:
                log.warning("%s", exc)
                return False
            except RunEnded as exc:
                log.info("%s", exc)
                return True
            except Exception as exc:  # noqa: BLE001 — Redis restarting or refusing: resume from the persisted state
                if not is_retryable(exc) and not self._holds_lease():
                    log.warning("run %s: %s after losing the lease: not this driver's to report; standing by", self.run_id, exc)
                    return False
                if not is_retryable(exc):
                    self._fail(exc)
                    return True
                log.warning("run %s: lost Redis (%s); resuming from the persisted state", self.run_id, exc)
                if self.shutdown.wait(2.0):
                    return True

    def _holds_lease(self) -> bool:
        """Whether this driver still holds its lease (a failure seen by a driver that lost it — a
        step another driver recorded meanwhile — is not the run's)."""
        try:
            return self.lease.held()
        except RedisError:
            return True  # cannot tell: the failure is reported under the lease or not at all

    def _fail(self, exc: Exception) -> None:
        """Any failure that is not a Redis outage ends the run with its reason: in Redis (under the
        lease) and in the run's durable record, which the API shows if Redis lost the run. A
        failure seen in a Redis that lost writes (a step record missing, state that no longer
        adds up) is reported as the lost data it comes from, whatever its symptom."""
        if not isinstance(exc, RedisLostData):
            try:
                self.lease.check()
            except RedisLostData as lost:
                exc = lost
            except RedisError:
                pass  # cannot tell: the failure is reported as it was seen
        if isinstance(exc, RedisLostData) or run_gone(exc):
            error = f"Redis lost data: {exc}. {LOST_DATA_ADVICE}"
            self.lease.accept_loss()
        else:
            error = f"{type(exc).__name__}: {exc}"
        log.error("run %s failed: %s", self.run_id, error, exc_info=exc)
        try:
            self.store.finish(RunStatus.failed, error=error)  # in Redis, under the lease, then in the durable record
        except RedisLostData as cannot:  # Redis lost writes again meanwhile: the durable record still says so
            log.error("run %s: cannot record the failure in Redis (%s)", self.run_id, cannot)
            self.store.record_durably(status=RunStatus.failed.value, error=error[:4000])
        except (RedisError, LeaseLost, RunEnded) as cannot:
            log.error("run %s: cannot record the failure (%s)", self.run_id, cannot)

    # -- the loop ----------------------------------------------------------------------------

    def drive(self) -> bool:
        """Run steps until the plan is done (True) or a stop is requested (False)."""
        lost = self.store.lost_state()
        if lost is not None:
            raise RedisLostData(lost)
        self._open_consumers()
        spec = self._spec()
        try:
            pool = load_pool(self.datasets, spec.datasets)
        except DatasetError as exc:
            raise RunFailed(str(exc)) from None
        self.store.sync_jsonl()
        state = self.store.state()
        k, phase = int(state.get("step", 0)), Phase(state.get("phase", Phase.publish.value))
        self.store.update(started_at=state.get("started_at") or time.time())
        if phase is Phase.estimate:
            self.store.update(status=RunStatus.estimating)
            estimation = DifficultyEstimation(self.store, self.steps, self.estimates, self.settings, spec, pool, k)
            self.side_jobs.register(pb.GROUP_KIND_ESTIMATE, estimation)
            try:
                self._run_side_job(estimation)
            finally:
                self.side_jobs.unregister(pb.GROUP_KIND_ESTIMATE)  # a late replay of its groups is dead-lettered
            phase = Phase.publish
        self.store.update(status=RunStatus.running)
        while True:
            self._check_control(allow_pause=phase is Phase.publish and self.steps.record(k) is None)  # a pause waits while a step is out
            if phase is Phase.publish:
                stage = self.plan.stage_for(self._spec(), k, pool)
                if stage is None:
                    if self._spec().on_plan_end == "finish":
                        self._finish_plan(k)
                        self._checkpoint_plan_end(k)
                        if self.plan.stage_for(self._spec(), k, pool) is None:  # no stage appended meanwhile
                            return True
                        continue
                    self._wait_for_stage()
                    continue
                m.STAGE.set(stage.index)
                m.CONTEXT_LENGTH.set(stage.config.context_length)
                m.STEP.set(k)
                if self.steps.record(k) is not None:  # published ahead while step k - 1 was out (bounded staleness)
                    self.store.update(phase=Phase.rollout)
                    phase = Phase.rollout
                    continue
                self.wait_for_version(k, allow_pause=True)
                self._check_control(allow_pause=True)
                if self.validation.due(self._spec(), k):
                    self._validate(k, stage.index, stage.config.context_length)
                self._serve_evals(k, stage.index, stage.config.context_length)
                self.publish_step(k, stage)
                phase = Phase.rollout
            if phase is Phase.rollout:
                ahead = self._ahead(k, pool)
                self.wait_for_step(k, ahead)
                faults.point(self.armed, "controller.completed", k)
                phase = Phase.sync
                self.store.update(phase=phase)
            if phase is Phase.sync:
                ahead = self._ahead(k, pool)  # with s >= 1 workers load k + 1 once their groups of step k + 1 are done: a step's time
                synced_at = self.wait_for_version(k + 1, ahead=ahead, seconds=self.settings.step_timeout_seconds if ahead else None)
                self.record_step(k, synced_at)
                k, phase = k + 1, Phase.publish

    def _spec(self) -> RunSpec:
        spec = self.store.spec()
        if spec is None:
            raise RunFailed("the run's spec is gone from Redis")
        return spec

    def _open_consumers(self) -> None:
        self.events = EventInbox(self.channels, self.steps, self.store, GROUP, error_grace_seconds=3 * self.settings.heartbeat_ttl_seconds + 60)
        scored = self.channels.group("scored", self.settings.filter_group)
        self.estimates = self.channels.group("estimates", GROUP)
        self.plan = StagePlan(self.store, self.steps, scored)
        self.validation = Validation(self.store, self.steps, self.estimates, self.datasets, self.settings)
        self.validation.restore_series()
        self.side_jobs = SideJobs(self.estimates)  # the receivers of the scored groups of each side job's kind
        self.side_jobs.register(pb.GROUP_KIND_VALIDATE, self.validation)
        self._ahead_done = -1  # bounded staleness: the step k whose steps k + 1 ... k + s are all out

    # -- control: pause, resume, stop, shutdown ------------------------------------------------

    def _check_control(self, allow_pause: bool = False) -> None:
        if self.shutdown.is_set():
            raise Shutdown()
        self._renew_lease()
        self.lease.check()  # RedisLostData if Redis holds fewer writes than this driver saw
        requested = self.store.requested()
        if "stop" in requested:
            raise Stopped()
        if allow_pause and "pause" in requested:
            self.store.update(status=RunStatus.paused)
            log.info("run %s paused", self.run_id)
            while "pause" in (requested := self.store.requested()):
                if "stop" in requested:
                    raise Stopped()
                if self.shutdown.is_set():
                    raise Shutdown()
                self._check_events()
                self._idle_evals()
                self.wake.wait(0.2)
                self.wake.clear()
            self.store.update(status=RunStatus.running)
            log.info("run %s resumed", self.run_id)

    def _wait_for_stage(self) -> None:
        """The plan is done and the run waits: return once a stage was appended (the policy the
        plan ended with is checkpointed meanwhile, as at a stage's end)."""
        k, keep = int(self.store.state().get("step", 0)), self._keep_version()
        if self._checkpoint_wanted(k, None, keep) and (self.steps.learner_checkpoint() or -1) < k:
            with self.store.transaction() as tx:
                self.steps.request_checkpoint(tx, k, keep)
        self.store.update(status=RunStatus.waiting)
        stages = len(self._spec().stages)
        log.info("run %s: plan done after %d stages; waiting for the next stage", self.run_id, stages)
        while len(self._spec().stages) == stages:
            self._check_control()
            self._check_events()
            self._idle_evals()
            self.wake.wait(0.2)
            self.wake.clear()
        self.store.update(status=RunStatus.running)

    # -- held-out validation ---------------------------------------------------------------------

    def _validate(self, version: int, stage_index: int, context_length: int) -> None:
        """Validate policy version `version`, which every live rollout worker serves."""
        try:
            self._run_side_job(self.validation.job(self._spec(), version, stage_index, context_length))
        except DatasetError as exc:
            raise RunFailed(f"validation: {exc}") from None

    def _run_side_job(self, job: SideJob):
        """Advance a side job (`magic.controller.sidejobs`) to its end, once every live rollout
        worker serves its policy version, this driver's checks between its steps; returns its
        result. (Workers that go away meanwhile hold up only the job, until its own timeout.)"""
        if job.version is not None:
            self.wait_for_version(job.version)
        while not job.advance():
            self._check_control()
            self._check_events(block_ms=200)
        return job.result()

    def _finish_plan(self, k: int) -> None:
        """The plan finished after k steps: validate the final policy (version k) too, unless the
        run has no validation (its figures are in GET /v1/runs/{run}/validation, not in a step
        record), and serve the evaluations requested meanwhile."""
        spec = self._spec()
        validate = spec.validation is not None and k > 0 and bool(spec.stages)
        if not validate and not self._open_evals():
            return
        try:  # the training is done: an evaluation that cannot be made fails alone, not the run
            self.wait_for_version(k)
        except RunFailed as exc:
            log.error("run %s: the final policy (version %d) is not evaluated: %s", self.run_id, k, exc)
            for record in self._open_evals():
                self.store.end_eval(record["id"], error=f"the run's plan finished and its final policy could not be evaluated: {exc}")
            return
        last = len(spec.stages) - 1
        if validate:
            try:
                self._validate(k, last, spec.stages[-1].context_length)
                if (figures := self.store.validation(k)) is not None:
                    self.store.append_final_validation(k, figures)  # the curve's last point in metrics.jsonl
            except EvaluationTimeout as exc:
                log.error("run %s: the final validation (version %d) failed: %s", self.run_id, k, exc)
        self._serve_evals(k, max(last, 0), spec.stages[-1].context_length if spec.stages else None)

    # -- checkpoints the plan asks for ------------------------------------------------------------

    def _keep_version(self) -> int | None:
        """The policy version whose checkpoint is kept whatever its age: the best validation's
        (`validation.best_by`); None without one, or when the initial model (version 0) is best."""
        top = best(self._spec().validation, self.store.validations())
        return top[0] if top is not None and top[0] > 0 else None

    def _checkpoint_wanted(self, k: int, stage: CurrentStage | None, keep: int | None) -> bool:
        """Whether the learner checkpoints version k at step k's boundary: a stage ended there
        (`checkpoint_at_end` of the stage that ended; `stage` None: the plan's last) or version k
        validated best yet (`keep`: `_keep_version()`)."""
        if k == 0:
            return False  # the initial model is its own directory
        stages = self._spec().stages
        ended = stages[stage.index - 1] if stage is not None and stage.start == k and stage.index > 0 else (stages[-1] if stage is None and stages else None)
        return bool(ended is not None and ended.checkpoint_at_end) or keep == k

    def _checkpoint_plan_end(self, k: int) -> None:
        """The plan finished after k steps: ask the learner for the checkpoint of version k (when
        the last stage or the best validation wants it) and wait until it is written — a run
        that ends has its final weights on disk — for at most the step timeout."""
        keep = self._keep_version()
        if not self._checkpoint_wanted(k, None, keep):
            return
        if (self.steps.learner_checkpoint() or -1) < k:
            with self.store.transaction() as tx:
                self.steps.request_checkpoint(tx, k, keep)
        deadline = time.monotonic() + self.settings.step_timeout_seconds
        while (self.steps.learner_checkpoint() or -1) < k:
            if time.monotonic() > deadline:
                why = f"the learner did not write the checkpoint of the final policy (version {k}) within {self.settings.step_timeout_seconds:.0f}s: see its log"
                log.error("run %s: %s", self.run_id, why)
                self.store.update(error=why)  # the run finishes (it trained), saying what it lacks
                return
            self._check_control()
            self._check_events(block_ms=200)
        log.info("run %s: the final policy (version %d) is checkpointed", self.run_id, k)

    # -- requested evaluations (POST /v1/runs/{run}/evals) -------------------------------------------

    def _open_evals(self) -> list[dict]:
        return [e for e in self.store.evals() if e["status"] in EVAL_OPEN]

    def _serve_evals(self, version: int, stage_index: int, context_length: int | None) -> None:
        """Serve every requested evaluation not finished yet on policy version `version`, which
        every live rollout worker serves (one started before a restart: on its own version)."""
        for record in self._open_evals():
            self._run_side_job(self.validation.eval_job(self._spec(), record, version, stage_index, context_length))

    def _idle_evals(self) -> None:
        """While the run is paused or waits for a stage (at step k, phase publish): serve the
        requested evaluations at once on version k if every live rollout worker serves it; else
        they wait (no worker yet: the next step boundary serves them)."""
        if not self._open_evals():
            return
        state = self.store.state()
        k = int(state.get("step", 0))
        if not self._serving(k):
            return
        stages = self._spec().stages
        index = min(max(int(state.get("stage", -1)), 0), len(stages) - 1)
        self._serve_evals(k, max(index, 0), stages[index].context_length if stages else None)

    # -- phases ------------------------------------------------------------------------------

    def publish_step(self, k: int, stage: CurrentStage, ahead: bool = False) -> None:
        """Publish step k's D_R prompt groups, tagged with version k, the stage's settings and
        its staleness bound, and move the barrier to `rollout` in the same transaction (`ahead`:
        while step k - 1 is out, the barrier stays where it is; the publish phase of step k finds
        the step published)."""
        cfg = self._spec().stages[stage.index]  # re-read: the driver never trains on a stale copy
        records = stage.source.take((k - stage.start) * cfg.rollout_batch_size, cfg.rollout_batch_size)
        seed = self._spec().seed
        groups = [
            prompt_group(
                self.run_id, rec, f"{k}:{i:05d}", k, stage.index, pb.GROUP_KIND_TRAIN,
                pb.SamplingParams(n=cfg.group_size, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.context_length, seed=group_seed(seed, k, i)),
            )
            for i, rec in enumerate(records)
        ]
        for group in groups:
            group.max_staleness = cfg.max_staleness
        if cfg.penalties is not None:  # the stage's penalties travel with each group to the reward service
            for group in groups:
                group.penalties_json = cfg.penalties.model_dump_json()
        faults.point(self.armed, "controller.publishing", k)
        keep = self._keep_version()
        checkpoint = self._checkpoint_wanted(k, stage, keep)
        with self.store.transaction() as tx:
            self.steps.publish_step(tx, k, stage.index, cfg, groups, checkpoint=checkpoint, keep_version=keep)
            if not ahead:
                self.store.set_phase(tx, Phase.rollout, stage.index)
        faults.point(self.armed, "controller.published", k)
        log.info(
            "step %d (stage %d '%s', T=%d): published %d prompt groups%s", k, stage.index, cfg.name, cfg.context_length, len(records),
            f" ahead (versions {max(0, k - cfg.max_staleness)}-{k} may generate them)" if ahead else "",
        )

    # -- bounded staleness: publishing ahead -------------------------------------------------------

    def _ahead(self, k: int, pool) -> Callable[[], None] | None:
        """While step k is out: what publishes the steps after it that bounded staleness allows
        (`StageConfig.max_staleness` s >= 1; None with s = 0, the recipe's barrier)."""
        spec, index = self._spec(), int(self.store.state().get("stage", -1))
        if not 0 <= index < len(spec.stages) or spec.stages[index].max_staleness == 0:
            return None  # s = 0 (the recipe): nothing more to look at
        stage = self.plan.stage_for(spec, k, pool)  # step k's stage: it was published in it
        return None if stage is None else lambda: self._publish_ahead(k, stage)

    def _publish_ahead(self, k: int, stage: CurrentStage) -> None:
        """Publish step j = k + 1 ... k + s while step k is out, each once every live rollout
        worker serves version j - s (its samples may come from versions j - s ... j). The
        pipeline drains (nothing is published ahead) before a step that starts a stage or may
        end one (a plateau rule needs step j - 1's record), one whose version is validated, and
        while an evaluation, a pause or a stop is requested: those happen at a step boundary
        with every worker on the step's version, as with s = 0."""
        if self._ahead_done == k:
            return  # steps k + 1 ... k + s are out: nothing to check until step k is recorded
        spec = self._spec()
        cfg = spec.stages[stage.index]
        s = cfg.max_staleness
        for j in range(k + 1, k + s + 1):
            if self.steps.record(j) is not None:
                continue  # published already (before a restart, too)
            if may_end(cfg, j - stage.start) or self.validation.due(spec, j):  # j may start the next stage, or is validated
                self._ahead_done = k  # not before step k is recorded, whatever happens meanwhile
                return
            if self._open_evals() or self.store.requested() & {"pause", "stop"}:
                return
            if not self._serving(j - s):
                return
            self.publish_step(j, stage, ahead=True)
        self._ahead_done = k

    def wait_for_version(self, version: int, allow_pause: bool = False, ahead: Callable[[], None] | None = None, seconds: float | None = None) -> float:
        """Block until at least one rollout worker of this run serves `version` and none serves
        an older one; returns when that happened. A pause is honoured while waiting when
        `allow_pause` (nothing of the step is out yet); `ahead` publishes the steps bounded
        staleness allows meanwhile; `seconds`: how long before the run fails (default
        `worker_wait_seconds`)."""
        seconds = seconds or self.settings.worker_wait_seconds
        deadline = time.monotonic() + seconds
        while True:
            self._check_events()
            if ahead is not None:
                ahead()
            if self._serving(version):
                return time.time()
            self._check_control(allow_pause)
            if time.monotonic() > deadline:
                workers, served = self.channels.alive("rollout"), self.steps.served_versions()
                raise RunFailed(
                    f"no rollout worker serves policy version {version} after {seconds:.0f}s "
                    f"(live workers and versions: { {n: served.get(n, -1) for n in workers} })"
                )
            time.sleep(0.05)

    def _serving(self, version: int) -> bool:
        """Whether at least one rollout worker of this run serves `version` and none an older one."""
        workers = self.channels.alive("rollout")
        served = self.steps.served_versions()
        live = [served.get(n, -1) for n in workers]
        m.LIVE_WORKERS.labels(service="rollout").set(len(workers))
        if live and min(live) >= version:
            m.POLICY_VERSION.set(min(live))
            return True
        return False

    def wait_for_step(self, k: int, ahead: Callable[[], None] | None = None) -> pb.StepCompleted:
        """Block until the learner completed step k; `ahead` publishes the steps bounded
        staleness allows meanwhile."""
        deadline = time.monotonic() + self.settings.step_timeout_seconds
        while k not in self.events.completed:
            self._check_events(block_ms=200 if ahead is None else 50)
            self._check_control()
            if ahead is not None:
                ahead()
            if time.monotonic() > deadline:
                raise RunFailed(f"step {k} did not complete within {self.settings.step_timeout_seconds:.0f}s")
        return self.events.completed[k][1]

    def _check_events(self, block_ms: int = 0) -> None:
        """Consume control events: remember StepCompleted, fail on WorkerError; record the
        outcomes of scored groups for online filtering; sample the stream gauges."""
        self._renew_lease()
        self.stream_sampler.maybe_sample()
        self.plan.read_scored()
        self.side_jobs.route()  # scored groups of the side jobs, each to the receiver of its kind
        self.events.poll(block_ms)

    def record_step(self, k: int, synced_at: float) -> None:
        """Append step k's record and move the barrier to step k + 1, in one transaction."""
        entry_id, done = self.events.take(k)
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
        if (validation := self.store.validation(k)) is not None:  # held-out figures of version k, validated before step k
            record["validation"] = validation
        if self.store.metrics_count() != k:
            raise RunFailed(f"step bookkeeping is inconsistent: recording step {k} but {self.store.metrics_count()} steps are recorded")
        faults.point(self.armed, "controller.recording", k)
        with self.store.transaction() as tx:
            self.store.record_step(tx, k, record)
            self.events.queue_ack_step(tx, entry_id)  # the StepCompleted(k) it records
        self.store.record_durably(step=k + 1, seq=self.lease.seen)
        faults.point(self.armed, "controller.recorded", k)
        self.retention.release_step(k + 1)  # every entry of step k is acknowledged: drop it
        self.store.sync_jsonl()
        for phase in ("rollout", "train", "weight_sync", "other"):
            m.STEP_SECONDS.labels(phase=phase).set(record[f"step_seconds_{phase}"])
