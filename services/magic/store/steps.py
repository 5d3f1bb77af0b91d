"""The step contract between the services, written once: who writes which fact of step k, and how.

One channel per fact (the streams are described in `proto/magic/v1/messages.proto`):

=========================  ===========================================  ==========================
fact                       channel (key in `magic.protocol.keys.RunKeys`)  written by
=========================  ===========================================  ==========================
step k is published        `step(k)` hash: `expected`, `stage`,          controller, in the MULTI
(what the learner needs)   `stage_config`, `published_at`, `checkpoint`, that XADDs the prompts and
                           `keep_version`; `groups(k)` hash:             moves the barrier
                           group id -> digest
version k is checkpointed  asked: `step(k).checkpoint` (with the step,   controller
                           or alone at the plan's end);
                           written: `learner_state.checkpoint = k`       learner, once it is on disk
a group is genuine         `groups(k)` (`groups("estimation")`, `groups("validation:<v>")`,  controller (same MULTI)
                           `groups("eval:<id>")`):
                           the SHA-256 of the PromptGroup it published
step k is trained          `learner_state.last_step = k` +               learner, one MULTI (below)
                           StepCompleted(k) on `events:learner` + acks of the
                           step's `scored` entries
version v is announced     a WeightUpdate on `weights` (the newest       learner (weight transport)
                           entry is the authority)
version v is loaded        `weight_versions` hash: worker -> version     rollout worker
a worker cannot go on      WorkerError on `events:<role>`                any service's serve loop
=========================  ===========================================  ==========================

The learner's commit of step k, idempotent under a crash at any point:

1. train; checkpoint (optional);
2. *prepare*: store StepCompleted(k) in `learner_state.prepared` (HSET);
3. *announce* v(k+1) through the weight transport (an XADD on `weights`);
4. *commit*: one MULTI — `last_step = k`, delete `prepared`, XACK the step's `scored` entries,
   XADD StepCompleted(k) on `events:learner`.

A learner restarting with `last_step = k - 1` finds one of three states: nothing prepared (it
trains step k again from the same pending entries); prepared but v(k+1) not announced (same:
the prepared record is dropped); prepared and v(k+1) announced (it completes step 4 with the
prepared record — the weights rollout workers may already serve are the ones committed). The
controller accepts a StepCompleted(k) only from the learner's event stream, only when
`last_step >= k`, and only once per step (`magic.controller.events`), so a forged or stray event
cannot move the barrier or change a step's record.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass

import redis

from magic.config.schema import StageConfig
from magic.protocol import codec, keys
from magic.protocol.pb import messages_pb2 as pb
from magic.store.lease import Direct, RedisLostData, Writer

ESTIMATION = "estimation"
"""The scope of difficulty-estimation groups in `RunKeys.groups` (train groups use their step)."""


def group_digest(group: pb.PromptGroup) -> str:
    """SHA-256 of the PromptGroup as the controller published it (deterministic serialization):
    a consumer recognises a genuine group — same id, same content — by it."""
    return hashlib.sha256(group.SerializeToString(deterministic=True)).hexdigest()


def validation_scope(version: int) -> str:
    """The scope of the validation groups of policy version `version` in `RunKeys.groups`."""
    return f"validation:{version}"


def eval_scope(eval_id: str) -> str:
    """The scope of the groups of requested evaluation `eval_id` (POST /v1/runs/{run}/evals)."""
    return f"eval:{eval_id}"


def group_scope(group: pb.PromptGroup) -> str | int:
    """Where the digest of `group` is filed. Held-out groups (GROUP_KIND_VALIDATE) are a step's
    validation (ids `val:<version>:...`) or a requested evaluation (ids `eval:<id>:...`)."""
    if group.kind == pb.GROUP_KIND_ESTIMATE:
        return ESTIMATION
    if group.kind == pb.GROUP_KIND_VALIDATE:
        if group.group_id.startswith("eval:"):
            return eval_scope(group.group_id.split(":")[1])
        return validation_scope(group.policy_version)
    return int(group.step)


@dataclass(frozen=True)
class StepRecord:
    """What the controller published for step k (the `step(k)` hash)."""

    step: int
    expected: int  # D_R: groups the learner waits for
    stage: int  # index of the stage in the run's plan
    stage_config: StageConfig  # the stage settings the learner trains the step with
    published_at: float  # unix seconds
    checkpoint: bool = False  # checkpoint the weights held (version k) before training step k
    keep_version: int | None = None  # a checkpoint retention keeps whatever its age (the best validation's)


@dataclass(frozen=True)
class CheckpointRequest:
    """A checkpoint the controller asks for at step k's boundary: of policy version k, keeping
    version `keep_version`'s (`StepStore.request_checkpoint`, `StepStore.checkpoint_request`)."""

    version: int
    keep_version: int | None


@dataclass(frozen=True)
class LearnerProgress:
    """The learner's committed position (`learner_state` hash)."""

    last_step: int  # -1 before the first step
    entropy_coef: float | None
    prepared: pb.StepCompleted | None  # step 2 of the commit, done but not step 4
    prepared_coef: float  # the entropy coefficient after the prepared step


def _keep_version(raw: dict[str, str]) -> int | None:
    """The `keep_version` field of a `step(k)` hash, decoded."""
    keep = raw.get("keep_version")
    return int(keep) if keep is not None else None


class StepStore:
    """The only code that reads or writes the step contract's keys (see the module docstring)."""

    def __init__(self, r: redis.Redis, run_id: str, writer: Writer | None = None):
        self.r = r
        self.run_id = run_id
        self.keys = keys.RunKeys(run_id)
        self.writer = writer or Direct(r)
        """The learner's lease for its commit (`magic.store.lease`); none for the rollout workers."""

    # -- controller: publishing ------------------------------------------------------------------

    def publish_groups(self, pipe: redis.client.Pipeline, scope: str | int, groups: list[pb.PromptGroup]) -> None:
        """Queue on `pipe` the XADD of each group to `prompts` and its digest in `groups(scope)`."""
        if not groups:
            return
        pipe.hset(self.keys.groups(scope), mapping={g.group_id: group_digest(g) for g in groups})
        for g in groups:
            pipe.xadd(self.keys.prompts, codec.encode(g))

    def publish_step(
        self, pipe: redis.client.Pipeline, k: int, stage: int, config: StageConfig, groups: list[pb.PromptGroup],
        checkpoint: bool = False, keep_version: int | None = None,
    ) -> None:
        """Queue on `pipe` step k's record and its groups (the caller adds the barrier move);
        `checkpoint`: the learner checkpoints version k before training the step."""
        fields = {"expected": len(groups), "stage": stage, "stage_config": config.model_dump_json(), "published_at": time.time(), "checkpoint": int(checkpoint)}
        if keep_version is not None:
            fields["keep_version"] = keep_version
        pipe.hset(self.keys.step(k), mapping=fields)
        self.publish_groups(pipe, k, groups)

    def record(self, k: int) -> StepRecord | None:
        raw = {a.decode(): b.decode() for a, b in self.r.hgetall(self.keys.step(k)).items()}
        if "expected" not in raw:
            return None
        return StepRecord(
            k, int(raw["expected"]), int(raw["stage"]), StageConfig.model_validate_json(raw["stage_config"]), float(raw.get("published_at") or 0.0),
            raw.get("checkpoint") == "1", _keep_version(raw),
        )

    def request_checkpoint(self, pipe: redis.client.Pipeline, k: int, keep_version: int | None = None) -> None:
        """Queue on `pipe` (the controller's fenced transaction) a request to the learner, idle at
        step k with no step k to come (the plan's end), for a checkpoint of version k
        (`learner_checkpoint` says when it is written)."""
        fields = {"checkpoint": 1} | ({"keep_version": keep_version} if keep_version is not None else {})
        pipe.hset(self.keys.step(k), mapping=fields)

    def checkpoint_request(self, k: int) -> CheckpointRequest | None:
        """What `request_checkpoint(k)` asked for, or None (also once step k is published: its
        record carries its own request)."""
        raw = {a.decode(): b.decode() for a, b in self.r.hgetall(self.keys.step(k)).items()}
        if raw.get("checkpoint") != "1" or "expected" in raw:
            return None
        return CheckpointRequest(k, _keep_version(raw))

    def checkpoint_written(self, version: int) -> None:
        """The learner: the checkpoint of `version` is on disk."""
        with self.writer.transaction() as tx:
            tx.hset(self.keys.learner_state, "checkpoint", version)

    def learner_checkpoint(self) -> int | None:
        """The newest version the learner wrote a checkpoint of on request (None: none yet)."""
        raw = self.r.hget(self.keys.learner_state, "checkpoint")
        return int(raw) if raw is not None else None

    def expected(self, k: int) -> int | None:
        raw = self.r.hget(self.keys.step(k), "expected")
        return int(raw) if raw is not None else None

    # -- every consumer: is this group one the controller published? -----------------------------

    def check_group(self, group: pb.PromptGroup) -> str | None:
        """None if `group` is exactly a group the controller published in this run, else why not."""
        if group.run_id != self.run_id:
            return f"group {group.group_id!r} belongs to run {group.run_id!r}, not {self.run_id!r}"
        digest = self.r.hget(self.keys.groups(group_scope(group)), group.group_id)
        if digest is None:
            return f"group {group.group_id!r} (step {group.step}) was never published by the controller"
        if digest.decode() != group_digest(group):
            return f"group {group.group_id!r} differs from the one the controller published"
        return None

    # -- learner: the commit ---------------------------------------------------------------------

    def learner_progress(self) -> LearnerProgress:
        raw = {a.decode(): b for a, b in self.r.hgetall(self.keys.learner_state).items()}
        prepared = pb.StepCompleted.FromString(raw["prepared"]) if raw.get("prepared") else None
        coef = raw.get("entropy_coef")
        return LearnerProgress(
            int(raw["last_step"]) if "last_step" in raw else -1,
            float(coef) if coef is not None else None,
            prepared,
            float(raw.get("prepared_coef") or 0.0),
        )

    def prepare(self, done: pb.StepCompleted, entropy_coef: float) -> None:
        """Commit step 2: remember StepCompleted(k) (and the entropy coefficient after it) before
        announcing v(k+1)."""
        with self.writer.transaction() as tx:
            tx.hset(self.keys.learner_state, mapping={"prepared": done.SerializeToString(), "prepared_coef": entropy_coef})

    def drop_prepared(self) -> None:
        with self.writer.transaction() as tx:
            tx.hdel(self.keys.learner_state, "prepared", "prepared_coef")

    def commit(self, done: pb.StepCompleted, source: str, entropy_coef: float, scored_group: str, entry_ids: list[str]) -> None:
        """Commit step 4, one MULTI: the step is trained, its entries acked, StepCompleted sent.
        Refused (RedisLostData) unless Redis holds step k - 1 as the learner's last: anything else
        means Redis lost the learner's writes since it attached."""
        with self.writer.transaction() as tx:  # LeaseLost first: a learner that lost its lease learns only that
            last = self.last_trained()
            if last != done.step - 1:
                raise RedisLostData(f"run {self.run_id}: committing step {done.step}, but Redis holds step {last} as the learner's last (Redis lost writes)")
            tx.hset(self.keys.learner_state, mapping={"last_step": done.step, "updated_at": time.time(), "entropy_coef": entropy_coef})
            tx.hdel(self.keys.learner_state, "prepared", "prepared_coef")
            if entry_ids:
                tx.xack(self.keys.scored, scored_group, *entry_ids)
            tx.xadd(self.keys.events_of("learner"), codec.encode(pb.Event(run_id=self.run_id, at=time.time(), source=source, step_completed=done)))

    def last_trained(self) -> int:
        """The learner's committed `last_step` (-1 before the first)."""
        raw = self.r.hget(self.keys.learner_state, "last_step")
        return int(raw) if raw is not None else -1

    # -- rollout workers: which version each serves ----------------------------------------------

    def learner_epoch(self) -> int:
        """The newest epoch of the run's learner lease (0 before any learner took it)."""
        raw = self.r.get(self.keys.epoch("learner"))
        return int(raw) if raw else 0

    def announcement_problem(self, update: pb.WeightUpdate, newest_epoch: int = 0) -> str | None:
        return announcement_problem(update, self.run_id, self.learner_epoch(), newest_epoch)

    def serve_version(self, worker: str, version: int) -> None:
        with self.writer.transaction() as tx:
            tx.hset(self.keys.weight_versions, worker, version)

    def served_versions(self) -> dict[str, int]:
        """Rollout worker -> the version it serves; a value that is no version (a rollout user's
        credentials can write any) is left out, as a worker serving nothing."""
        out = {}
        for a, b in self.r.hgetall(self.keys.weight_versions).items():
            try:
                out[a.decode()] = int(b)
            except ValueError:
                continue
        return out


_CHECKSUM = re.compile(r"^sha256:[0-9a-f]{64}$")
TRANSPORTS = ("filesystem", "http", "nccl")


def announcement_problem(update: pb.WeightUpdate, run_id: str, learner_epoch: int, newest_epoch: int = 0) -> str | None:
    """None if `update` can be an announcement of run `run_id`'s learner, else why not.

    It must name this run and a transport, carry what its transport needs (a directory or URL,
    a SHA-256 checksum and a size), and be signed by a learner lease epoch that exists
    (`learner_epoch`, the epoch counter: only a learner that took the lease can have it; 0 only
    while none ever did) and is not older than the newest epoch already seen (`newest_epoch`: an
    announcement of a learner that lost its lease to another is stale)."""
    if update.run_id != run_id:
        return f"it names run {update.run_id!r}"
    if update.transport not in TRANSPORTS:
        return f"unknown transport {update.transport!r}"
    if update.epoch > learner_epoch or (learner_epoch > 0 and update.epoch == 0):
        return f"epoch {update.epoch} was never a learner lease's epoch (the newest is {learner_epoch})"
    if update.epoch < newest_epoch:
        return f"epoch {update.epoch} is older than epoch {newest_epoch}, which announced already (a learner that lost its lease)"
    if update.transport == "nccl":  # a broadcast phase, or the snapshot of a version (its marker holds the checksum)
        return None if update.HasField("nccl") or update.uri else "an nccl announcement with neither a phase nor a snapshot"
    if update.HasField("nccl"):
        return "an NCCL phase on a non-nccl transport"
    if not update.uri or not _CHECKSUM.match(update.checksum) or update.num_bytes <= 0:
        return f"v{update.version} names no directory, checksum or size (uri {update.uri!r}, checksum {update.checksum!r}, {update.num_bytes} bytes)"
    return None


def event_problem(event: pb.Event, run_id: str) -> str | None:
    """None if `event` is a well-formed event of run `run_id`, else why it is refused."""
    if event.run_id != run_id:
        return f"event of run {event.run_id!r} on run {run_id!r}'s stream"
    if event.WhichOneof("kind") is None:
        return "event carries no kind (not an Event, or an unknown one)"
    return None
