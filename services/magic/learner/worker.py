"""The learner worker: collects each on-policy step's scored groups, trains, publishes weights.

    attach: load the policy — the latest checkpoint if the run already progressed (weights,
            optimizer, entropy controller), else the run's initial model — and publish it if
            the rollout workers have not got it yet
            (the newest announcement is the authority); finish a step whose commit was cut short
    loop:
        pull scored groups into the step ledger (each group id counted once; a group the
          controller did not publish is dead-lettered)
        step k published with a checkpoint request (a stage's end, the best validation yet):
            checkpoint version k (held now) before training it
        when step k has all its D_R groups:
            train on them (trainer.train_step), checkpoint version k + 1 when it is a
              multiple of `checkpoint_every`
            prepare StepCompleted(k), publish version k + 1, then commit in one MULTI:
            last_step = k, acknowledge every entry of step k, StepCompleted(k) on `events`
        idle at step k with a checkpoint request alone (the plan's end): checkpoint version k

The commit protocol (and why a crash at any point of it trains each step once and sends
StepCompleted once) is `magic.store.steps`. Scored entries stay unacknowledged until their
step is committed, so a learner that dies mid-step gets them back (its own pending entries, or
a new learner reclaims them once the old heartbeat expires); entries of steps already trained
are acknowledged and dropped.

Several ranks (backend "deepspeed", started by `deepspeed`/`torchrun`): rank 0 alone talks to
Redis, runs this worker and *broadcasts* each collective operation — attach, train a step
(with the step's groups as serialized protobufs), publish, checkpoint, detach — to the other
ranks, which run `follow()`: they hold the same model and execute the same operation. Every rank
thus sees the whole batch, takes its share of sequences (trainer.shard) and sums its
gradients, entropy and token counts with the others.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path

import torch

from magic import modeling
from magic.prompts import load_tokenizer
from magic.config.schema import RunSpec, StageConfig
from magic.learner import backends, checkpoints, memory, streaming
from magic.learner.checkpoints import latest_checkpoint
from magic.learner.ledger import StepLedger
from magic.learner.loading import check_files
from magic.learner.settings import LearnerSettings
from magic.learner.trainer import Trainer
from magic.observability import metrics as m
from magic.observability.metrics import registry_of, serve_http
from magic.observability.logs import setup_logging
from magic.protocol import keys
from magic.protocol.layout import checkpoint_root as run_checkpoint_root
from magic.protocol.pb import messages_pb2 as pb
from magic.runtime import faults
from magic.runtime.liveness import LoopWatch
from magic.runtime.service import Worker, WorkerRestart, serve
from magic.store.channels import RunChannels
from magic.store.lease import LEARNER, LeaseLost, RedisLostData, RunEnded
from magic.store.steps import CheckpointRequest, StepRecord
from magic.store.streams import Entry
from magic.weights import WeightIntegrityError, make_sender
from magic.weights.base import StateBuckets

log = logging.getLogger(__name__)

SERVICE = "learner"
GROUP = keys.LEARNER_GROUP
CHECKPOINT_RETRY_SECONDS = 60.0
"""A checkpoint the controller asked for whose write failed is tried again this much later."""


class MemoryPlanError(RuntimeError):
    """A stage whose memory plan does not fit the learner's GPUs: the run fails with the plan's reason."""


def run_dir(settings: LearnerSettings, run_id: str) -> Path:
    return settings.data_dir / "runs" / run_id


def checkpoint_root(settings: LearnerSettings, run_id: str) -> Path:
    return run_checkpoint_root(run_dir(settings, run_id))


def _device(settings: LearnerSettings) -> torch.device:
    device = torch.device(settings.device)
    if device.type == "cuda" and device.index is None and settings.backend == "deepspeed":
        return torch.device("cuda", settings.local_rank)
    return device


def build_trainer(settings: LearnerSettings, spec: RunSpec, model_dir: str, load_universal: bool = False) -> Trainer:
    """The policy from `model_dir` (HF format) on this rank's backend; the reference policy (the
    run's initial model) is loaded at the first step whose stage sets kl_coef > 0."""
    device = _device(settings)
    check_files(model_dir)  # weights that do not match config.json: one clear error before anything is loaded
    tokenizer = load_tokenizer(spec.model)
    precision = dict(precision=settings.precision, activation_checkpointing=settings.activation_checkpointing)
    if settings.backend == "deepspeed":  # never whole in float32 on a rank: partitioned (ZeRO-3) or in the training precision
        model = backends.DeepSpeedBackend.load_policy(model_dir, device, settings.zero_stage, settings.precision)
        backend: backends.Backend = backends.DeepSpeedBackend(
            model, spec.optim, device, settings.zero_stage, settings.logprob_chunk_size, **precision, model_dir=spec.model, load_universal=load_universal
        )
    else:
        model = modeling.load_model(model_dir, device)  # float32: the master weights of bf16 training come from it
        backend = backends.TorchBackend(model, spec.optim, device, settings.logprob_chunk_size, **precision, model_dir=spec.model)

    def load_reference() -> torch.nn.Module:
        return modeling.load_model(spec.model, device).requires_grad_(False)

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return Trainer(backend, spec.optim, pad, settings.micro_batch_tokens, load_reference=load_reference, chunk_size=settings.logprob_chunk_size, assets_from=spec.model)


def publish_dtype(settings: LearnerSettings) -> torch.dtype:
    """The dtype published weights are cast to (`LearnerSettings.publish_dtype`)."""
    if settings.publish_dtype == "auto":
        return backends.PRECISION_DTYPES[settings.precision]
    return getattr(torch, settings.publish_dtype)


COMMAND_KEY = "magic/learner/command/{}"
"""Key of the distributed store that rank 0 sets before broadcasting its n-th command. Followers
wait for it on the store, in short polls, as long as rank 0 takes (a rollout phase, no active run):
idle waiting is never a collective, so the collectives' timeout (`collective_timeout_seconds`) can
be minutes and a rank stuck with a dead peer is found in minutes."""

_commands_sent = 0
"""Commands rank 0 broadcast so far; on a follower, the commands it received (the same count)."""


def _store():
    """The launcher's key-value store of the default process group (torchrun's, or MASTER_ADDR's)."""
    return torch.distributed.distributed_c10d._get_default_store()


def _broadcast(command: tuple) -> None:
    global _commands_sent
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        _commands_sent += 1
        _store().set(COMMAND_KEY.format(_commands_sent), command[0])
        torch.distributed.broadcast_object_list([command], src=0)


def _store_wait(key: str, poll_seconds: float = 30.0) -> None:
    """Wait, as long as it takes, for rank 0 to set `key` on the launcher's store (short polls: never
    bounded by the collectives' timeout). Raises if the store itself fails (rank 0's launcher gone)."""
    import datetime

    while True:
        try:
            _store().wait([key], datetime.timedelta(seconds=poll_seconds))
            return
        except torch.distributed.DistStoreError as exc:  # not yet: rank 0 is busy elsewhere, or idle
            if "timeout" not in str(exc).lower() and "timed out" not in str(exc).lower():
                raise


def _next_command(received: int, poll_seconds: float = 30.0) -> tuple:
    """A follower's wait for rank 0's command number `received + 1`, then the command (a broadcast)."""
    _store_wait(COMMAND_KEY.format(received + 1), poll_seconds)
    box = [None]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


class LearnerWorker(Worker):
    def __init__(self, channels: RunChannels, settings: LearnerSettings):
        self.run_id = run_id = channels.run_id
        self.settings = settings
        self.name = settings.worker_name
        # one learner commits per run: the others stand by until its lease expires
        self.lease = channels.lease(LEARNER, self.name, settings.heartbeat_ttl_seconds)
        try:
            if not self.lease.try_acquire():
                raise WorkerRestart(f"run {run_id}: the learner lease is held by {self.lease.holder_now() or '?'}; standing by")
        except RunEnded as exc:  # the run ended while this learner was away: nothing to do
            raise WorkerRestart(str(exc)) from None
        try:
            self._open(channels.fenced(self.lease.keep()), settings)
        except BaseException:
            self.lease.stop_keeping()
            self.lease.release()
            raise

    def _open(self, channels: RunChannels, settings: LearnerSettings) -> None:
        """Everything this learner writes goes through `channels`, under its lease."""
        run_id = self.run_id
        self.spec = channels.spec()
        self.scored = channels.group("scored", GROUP)
        self.weights = channels.stream("weights")
        self.steps = channels.steps
        self.ledger: StepLedger[pb.ScoredGroup] = StepLedger()
        self._stream: streaming.StreamingStep | None = None  # the step being trained group by group
        self._streamed: set[str] = set()
        self._stream_refused: tuple[int, str] | None = None
        self.ckpt_root = checkpoint_root(settings, run_id)
        self.armed = settings.armed_faults
        self.weight_sender = make_sender(
            settings.weight_transport,
            channels=channels,
            root=run_dir(settings, run_id) / "weights",
            config_json=modeling.load_model_config(self.spec.model).to_json_string(),
            keep=settings.keep_weight_versions,
        )
        self._record: StepRecord | None = None  # the record of step `self.step`, once published
        self._checkpointed = -1  # the step at whose boundary the checkpoint the controller asked for was written
        self._checkpoint_retry_at = 0.0  # monotonic time before which a failed requested checkpoint is not tried again
        announced = self._finish_cut_commit()
        progress = self.steps.learner_progress()
        self.step = progress.last_step + 1  # the next step to train
        self.version = self.step  # on-policy: version k is the policy after k steps
        if self.step > 0 and announced != self.version:
            raise RedisLostData(
                f"run {self.run_id}: Redis holds step {self.step - 1} as the learner's last committed step but v{announced} as the newest announced "
                "weights: it lost writes (restarted from an older state)"
            )
        self._planned: set[str] = set()
        for stage in self.spec.stages:  # before anything is loaded: a shape that cannot fit is refused now
            self.check_stage(stage)
        model_dir, ckpt = self._resume_source()
        self._optimizer_reset = self.version > 0 and ckpt is None
        """Resumed without the optimizer state of the step it resumes (no intact checkpoint of it):
        recorded in the next step's record (`optimizer_reset`), never silent."""
        _broadcast(("attach", self.run_id, self.spec.model_dump_json(), model_dir, str(ckpt) if ckpt else None))
        self.trainer = _attach(settings, self.spec, model_dir, ckpt)
        if ckpt is None and self.version > 0:
            self.trainer.controller.coef = progress.entropy_coef or 0.0
            self.trainer.controller.step = self.step
        if announced is None:  # v0: announced once, never rewritten by a restarted learner
            self.publish()

    def check_stage(self, stage: StageConfig) -> None:
        """The memory plan of `stage` on this learner's shape (`magic.learner.memory`): raise
        MemoryPlanError, which fails the run with the plan's reason and the knob to turn, before
        any weight of a stage that cannot fit is loaded or trained. Each stage is checked once."""
        if not self.settings.check_memory or stage.name in self._planned:
            return
        try:
            model = memory.ModelShape.from_path(self.spec.model)
        except memory.ModelShapeError as exc:  # a model the plan does not cover (mixture of experts, ...): not a reason to refuse
            log.warning("no memory plan for stage %r: %s", stage.name, exc)
            self._planned.add(stage.name)
            return
        device = _device(self.settings)
        device_bytes = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
        host_bytes = self.settings.host_memory_bytes or memory.host_memory_limit()
        problems = memory.stage_problems(model, stage, self.settings, device_bytes, host_bytes)
        if problems:
            raise MemoryPlanError(f"run {self.run_id}: the learner's memory plan does not fit: " + " | ".join(problems) + " (magic memory prints the plan)")
        self._planned.add(stage.name)

    def _announced(self) -> tuple[str, pb.WeightUpdate] | None:
        """The announcement of the highest version of this run on `weights` (poison, stale epochs and
        replays of older versions skipped, wherever they are on the stream)."""
        return self.weights.newest(pb.WeightUpdate, check=self.steps.announcement_problem, rank=lambda u: (u.version, u.epoch))

    def _finish_cut_commit(self) -> int | None:
        """A learner killed between announcing v(k+1) and committing step k left StepCompleted(k)
        prepared: commit it now (the weights are out, so the step is done). A prepared step whose
        weights were never announced is dropped and trained again. Returns the newest announced
        version."""
        newest = self._announced()
        version = newest[1].version if newest else None
        progress = self.steps.learner_progress()
        done = progress.prepared
        if done is None:
            return version
        if done.step == progress.last_step + 1 and version == done.step + 1:
            done.published_at = newest[1].published_at
            log.warning("step %d was trained and v%d announced before a crash: completing its commit", done.step, version)
            self.steps.commit(done, self.name, progress.prepared_coef, GROUP, [])  # its entries are acked as late copies
        else:
            log.warning("dropping prepared step %d (v%d was not announced): it is trained again", done.step, done.step + 1)
            self.steps.drop_prepared()
        return version

    def _resume_source(self) -> tuple[str, Path | None]:
        """Where the policy comes from: the initial model, the checkpoint of the version it resumes
        (the weights after the last trained step) if it is intact (`checkpoints.verify`: every file against its digest), else the last
        published weights (checked against their digests too), with a fresh optimizer; the run
        fails only when neither loads."""
        if self.version == 0:
            return self.spec.model, None
        ckpt = latest_checkpoint(self.ckpt_root, version=self.version)
        if ckpt is not None:
            log.info("resuming at step %d from checkpoint %s", self.step, ckpt)
            return str(ckpt), ckpt
        log.warning(
            "resuming at step %d from weights v%d without a (readable) checkpoint of v%d (optimizer state restarts)", self.step, self.version, self.version
        )
        model = modeling.load_model(self.spec.model)
        try:
            state = self.weight_sender.load_version(self.version)
        except WeightIntegrityError as exc:
            raise RuntimeError(f"run {self.run_id}: cannot resume step {self.step}: no readable checkpoint of v{self.version} under {self.ckpt_root}, and {exc}") from None
        modeling.load_state_dict(model, state)
        out = run_dir(self.settings, self.run_id) / "resume" / f"v{self.version}"
        model.save_pretrained(out, safe_serialization=True)
        return str(out), None

    def _checkpoint_fence(self, k: int) -> Callable[[], None]:
        """What a checkpoint of version k passes before it is renamed into place (on the writer's thread):
        this learner still holds its lease and Redis lost nothing."""

        def fence() -> None:
            faults.point(self.armed, "learner.checkpoint_ready", k - 1)  # numbered by the step it follows, as the other points
            self.lease.ensure_held()

        return fence

    def status(self) -> dict:
        return {"step": self.step, "version": self.version, "collected": self.ledger.count(self.step)}

    # -- the loop ----------------------------------------------------------------------------

    def poll(self) -> None:
        try:
            self._poll()
        except LeaseLost:
            raise
        except Exception as exc:
            if not self._holds_lease():  # what a learner that lost its lease meets is not the run's failure
                raise LeaseLost(f"run {self.run_id}: learner {self.name} lost its lease ({type(exc).__name__}: {exc})") from exc
            raise

    def _holds_lease(self) -> bool:
        try:
            return self.lease.held()
        except Exception:  # noqa: BLE001 — cannot tell (Redis away): the error speaks for itself
            return True

    def _poll(self) -> None:
        if self.lease.epoch is None:
            raise LeaseLost(f"run {self.run_id}: learner {self.name} lost its lease")
        # only the lease holder consumes `scored`: entries pending at any other learner are reclaimed
        entries = self.scored.reclaim_from_others_if_due(self.settings.heartbeat_ttl_seconds / 2) or self.scored.read(count=64, block_ms=500)
        for entry in entries:
            self.collect(entry)
        record = self.published(self.step)
        if record is not None:
            self._stream_arrivals(record)
            if self.ledger.is_complete(self.step, record.expected):
                self.train_and_publish(record)
        elif self._checkpointed != self.step and time.monotonic() >= self._checkpoint_retry_at and (request := self.steps.checkpoint_request(self.step)) is not None:
            self.checkpoint_on_request(request)  # the plan's end: no step to come

    def checkpoint(self, version: int, protect: int | None) -> None:
        """Write the checkpoint of `version` (the weights held now) in the background, keeping
        `keep_checkpoints` and version `protect`'s."""
        keep = self.settings.keep_checkpoints
        _broadcast(("checkpoint", str(self.ckpt_root), version, keep, protect))
        self.trainer.save_checkpoint(self.ckpt_root, version, keep, fence=self._checkpoint_fence(version), epoch=self.lease.epoch or 0, protect=protect)

    def checkpoint_on_request(self, request: CheckpointRequest) -> None:
        """The controller's request at the plan's end, the learner idle: the checkpoint of
        `request.version` (held now) on disk — kept if an intact one is there already —, then said
        so (`StepStore.checkpoint_written`); a write that failed is tried again a minute later."""
        assert request.version == self.version, (request, self.version)
        self.trainer.wait_for_checkpoint()  # one written in the background may be this one
        final = checkpoints.step_dir(self.ckpt_root, request.version)
        if not (final.is_dir() and checkpoints.problem(final) is None):
            t0 = time.perf_counter()
            self.checkpoint(request.version, request.keep_version)
            self.trainer.wait_for_checkpoint()
            log.info("checkpoint of v%d written on request in %.1fs", request.version, time.perf_counter() - t0)
        why = checkpoints.problem(final) if final.is_dir() else "not written"
        if why is None:
            self.steps.checkpoint_written(request.version)
            self._checkpointed = self.step
        else:
            log.error("the checkpoint of v%d the controller asked for is not on disk (%s): trying again in %.0fs", request.version, why, CHECKPOINT_RETRY_SECONDS)
            self._checkpoint_retry_at = time.monotonic() + CHECKPOINT_RETRY_SECONDS

    def _stream_arrivals(self, record: StepRecord) -> None:
        """Train the step's groups that arrived since the last poll (on-policy steps that can
        stream, `magic.learner.streaming`); the update waits for the last group."""
        if not self.settings.stream:
            return
        k, stage = record.step, record.stage_config
        if self._stream is None or self._stream.version != k:
            reason = streaming.why_not(stage, self.trainer.backend)
            if reason is not None:
                if self._stream_refused != (k, reason):
                    log.info("step %d trains the whole batch at once: %s", k, reason)
                    self._stream_refused = (k, reason)
                return
            self.check_stage(stage)  # a stage appended after the run attached: its plan, before training it
            self._stream, self._streamed = streaming.StreamingStep(self.trainer, k, stage), set()
        new = {group_id: group for group_id, group in self.ledger.items(k).items() if group_id not in self._streamed}
        if new:
            self._stream.add(*new.values())  # the groups of one poll in shared micro-batches
            self._streamed.update(new)

    def published(self, k: int) -> StepRecord | None:
        """Step k's record (its D_R and stage) once the controller published it. The stage's
        entropy settings are exported as soon as they are known, before the step trains."""
        if self._record is None or self._record.step != k:
            record = self.steps.record(k)
            if record is None:
                return None
            self._record = record
            ent = record.stage_config.entropy
            m.export_step({"entropy_target": ent.target, "entropy_coef": self.trainer.controller.current(ent)})
            if record.checkpoint and self._checkpointed != k:  # a stage ended or a validation was the best yet: the weights held now, in the background
                self.checkpoint(k, record.keep_version)
                self._checkpointed = k
        return self._record

    def collect(self, entry: Entry) -> None:
        group = self.scored.decode(entry, pb.ScoredGroup)
        if group is None:
            return
        problem = self._problem(group)
        if problem is not None:
            self.scored.dead_letter(entry, f"refused ScoredGroup: {problem}")
            return
        step = group.rollout.prompt.step
        if step < self.step:  # a late copy of a group of a step already trained
            self.ledger.duplicates += 1
            self.scored.ack(entry.id)
            return
        self.ledger.add(step, group.rollout.prompt.group_id, entry.id, group)

    def _problem(self, group: pb.ScoredGroup) -> str | None:
        """Why `group` cannot be trained on, or None: it must be a train group the controller
        published, with its gs samples and one score per sample."""
        prompt = group.rollout.prompt
        if prompt.kind != pb.GROUP_KIND_TRAIN:
            return f"group {prompt.group_id!r} is not a train group"
        if (problem := self.steps.check_group(prompt)) is not None:
            return problem
        if len(group.rollout.samples) != prompt.sampling.n:
            return f"group {prompt.group_id}: {len(group.rollout.samples)} samples, the prompt asked for {prompt.sampling.n}"
        if len(group.scores) != len(group.rollout.samples):
            return f"group {prompt.group_id}: {len(group.scores)} scores for {len(group.rollout.samples)} samples"
        return None

    def train_and_publish(self, record: StepRecord) -> None:
        """Train step k on its complete batch, with the stage the controller published it with,
        then commit it (`magic.store.steps`)."""
        k, step_record = record.step, record
        batch_complete_at = time.time()
        stage = record.stage_config
        self.check_stage(stage)  # a stage appended after the run attached: its plan, before training it
        self._stream_arrivals(record)
        groups, entry_ids = self.ledger.pop(k)
        faults.point(self.armed, "learner.collected", k)
        t0 = time.perf_counter()
        if self._stream is not None and self._stream.version == k:  # every group trained as it came: apply the update
            record, self._stream = self._stream.finish(), None
            record["streamed"] = 1.0
        else:
            _broadcast(("train", [g.SerializeToString() for g in groups], k, stage.model_dump_json()))
            record = self.trainer.train_step(groups, version=k, stage=stage)
            record["streamed"] = 0.0
        train_seconds = time.perf_counter() - t0
        record["duplicates"] = float(self.ledger.duplicates)
        record["optimizer_reset"] = 1.0 if self._optimizer_reset else 0.0  # AdamW's moments started afresh at this step
        self._optimizer_reset = False
        record["train_seconds"] = train_seconds
        m.export_step(record)
        m.VERSION_MISMATCH.inc(record["version_mismatch"])
        every = self.settings.checkpoint_every
        if every and (k + 1) % every == 0:  # version k + 1, in the background: the next step goes on
            t1 = time.perf_counter()
            self.checkpoint(k + 1, step_record.keep_version)
            record["checkpoint_seconds"] = time.perf_counter() - t1
        faults.point(self.armed, "learner.trained", k)
        coef = self.trainer.controller.coef
        done = pb.StepCompleted(
            step=k, new_version=k + 1, metrics=record, batch_complete_at=batch_complete_at, train_seconds=train_seconds, epoch=self.lease.epoch or 0
        )
        self.steps.prepare(done, coef)
        faults.point(self.armed, "learner.prepared", k)
        self.step, self.version = k + 1, k + 1
        done.published_at = self.publish().published_at
        faults.point(self.armed, "learner.announced", k)
        self.steps.commit(done, self.name, coef, GROUP, entry_ids)
        faults.point(self.armed, "learner.committed", k)
        m.LEARNER_STEP.set(k)
        log.info(
            "step %d: reward %.3f acc %.3f entropy %.3f (c=%.4f, bonus %s) trained %d tokens in %.2fs -> v%d",
            k, record["reward_mean"], record["accuracy_all"], record.get("entropy", float("nan")), record.get("entropy_coef", 0.0),
            "on" if record.get("entropy_bonus_active") else "off", int(record.get("tokens_trained", 0)), train_seconds, self.version,
        )

    def publish(self) -> pb.WeightUpdate:
        """Hand the weights to the weight transport (it announces the version on `weights`) bucket
        by bucket: the transport writes or sends each bucket while the ranks gather the next one
        (ZeRO-3 partitions them), so rank 0 holds one bucket beyond its share
        (`backends.PUBLISH_BUCKET_BYTES`)."""
        _broadcast(("publish",))
        dtype = publish_dtype(self.settings)
        layout = self.trainer.backend.published_layout(dtype)
        buckets = self.trainer.backend.state_dict_buckets(backends.PUBLISH_BUCKET_BYTES, dtype)
        try:
            return self.weight_sender.publish(self.version, StateBuckets(layout, buckets))
        finally:  # the other ranks gather every bucket: so does rank 0, whatever became of the transport
            for _ in buckets:
                pass

    def close(self) -> None:
        try:
            self.trainer.wait_for_checkpoint()  # the one being written in the background
            _broadcast(("detach",))
            self.weight_sender.close()
        finally:
            self.lease.stop_keeping()
            self.lease.release()


def _attach(settings: LearnerSettings, spec: RunSpec, model_dir: str, ckpt: str | Path | None) -> Trainer:
    """Every rank: the trainer of the run, resumed from checkpoint `ckpt` if given — at the shape
    that wrote it, or at another (world size, ZeRO stage, precision) through DeepSpeed's universal
    format, converted once by rank 0 (`checkpoints.to_universal`); a change of backend is refused
    (`checkpoints.ResumeShapeError`, saying what to do)."""
    universal = None
    if ckpt is not None:
        ckpt = Path(ckpt)
        now = {"backend": settings.backend, "world_size": settings.world_size, "zero_stage": settings.zero_stage if settings.backend == "deepspeed" else None,
               "precision": settings.precision}
        saved = checkpoints.saved_shape(ckpt)
        if checkpoints.resume_mode(saved, now) == "universal":
            out = ckpt.parent.parent / "universal" / ckpt.name
            key = f"magic/learner/universal/{_commands_sent}"  # the attach command's number: one key per conversion
            if settings.rank == 0:
                log.warning("checkpoint %s was written at %s; this learner is %s: converting it to DeepSpeed's universal format", ckpt.name, saved, now)
                try:
                    checkpoints.to_universal(ckpt, out)
                except BaseException as exc:
                    _tell_followers(key, f"failed: {type(exc).__name__}: {exc}")
                    raise
                _tell_followers(key, "ok")
            else:
                outcome = _wait_for_rank0(key)
                if outcome != "ok":
                    raise RuntimeError(f"rank 0 could not convert checkpoint {ckpt} to DeepSpeed's universal format ({outcome})")
            universal = out
    trainer = build_trainer(settings, spec, model_dir, load_universal=universal is not None)
    if ckpt is not None:
        trainer.load_checkpoint(ckpt, optimizer_from=universal)
    return trainer


def _tell_followers(key: str, outcome: str) -> None:
    """Rank 0's outcome of something long it did alone (a checkpoint conversion), for `_wait_for_rank0`."""
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        _store().set(key, outcome)


def _wait_for_rank0(key: str) -> str:
    """A follower's wait for rank 0's outcome under `key`, on the store (not in a collective), as long
    as it takes; "ok" or "failed: ..."."""
    if not (torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1):
        return "ok"
    _store_wait(key)
    return _store().get(key).decode()


def follow(settings: LearnerSettings) -> int:
    """Ranks > 0: execute rank 0's collective operations until it stops.

    Waiting for the next command may take as long as rank 0 wants (a rollout phase, no active
    run); executing one may not take longer than `liveness_stall_seconds`. The first rank of each
    further pod (LOCAL_RANK 0) serves the pod's /livez and /readyz on the metrics port."""
    watch = LoopWatch(settings.liveness_stall_seconds)
    if settings.local_rank == 0 and settings.metrics_port is not None:
        serve_http(settings.metrics_port, lambda: True, registry=registry_of(SERVICE), stalled=watch.stalled)
    global _commands_sent
    trainer: Trainer | None = None
    while True:
        with watch.allowing(float("inf"), "waiting for rank 0's next command"):
            cmd, *args = _next_command(_commands_sent)
        _commands_sent += 1
        if cmd == "attach":
            _, spec_json, model_dir, ckpt = args
            trainer = None  # the previous run's model goes before the next one loads
            with watch.allowing(settings.attach_timeout_seconds, "attaching"):
                trainer = _attach(settings, RunSpec.model_validate_json(spec_json), model_dir, ckpt)
        elif cmd == "train":
            raw, version, stage_json = args
            groups = [pb.ScoredGroup.FromString(b) for b in raw]
            trainer.train_step(groups, version=version, stage=StageConfig.model_validate_json(stage_json))
        elif cmd == "publish":
            for _ in trainer.backend.state_dict_buckets(backends.PUBLISH_BUCKET_BYTES, publish_dtype(settings)):
                pass  # rank 0's transport consumes each bucket as the ranks gather it
        elif cmd == "checkpoint":
            root, version, keep, protect = args
            trainer.save_checkpoint(Path(root), version, keep, protect=protect)
        elif cmd == "detach":
            trainer = None
        elif cmd == "stop":
            log.info("rank %d stopped with rank 0", torch.distributed.get_rank())
            return 0
        else:
            raise RuntimeError(f"unknown learner command {cmd!r}")
        watch.beat()


def run(settings: LearnerSettings | None = None) -> int:
    settings = settings or LearnerSettings()
    rank, world = settings.rank, settings.world_size
    if settings.backend == "deepspeed":
        rank, world = backends.init_distributed(_device(settings), settings.collective_timeout_seconds)
    elif world > 1:
        raise RuntimeError(f"WORLD_SIZE={world} needs MAGIC_BACKEND=deepspeed; the torch backend runs on one process")
    if rank > 0:
        setup_logging(SERVICE, f"{settings.worker_name}-rank{rank}", settings.log_level)
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        # A launcher stopping its pod signals every rank at once; a follower that died on it would
        # fail rank 0's last collectives. It finishes what rank 0 asks, up to rank 0's "stop".
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: log.info("signal %d: stopping when rank 0 does", signum))
        return follow(settings)
    try:
        return serve(SERVICE, settings, lambda channels: LearnerWorker(channels, settings))
    finally:
        _broadcast(("stop",))
