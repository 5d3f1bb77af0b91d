"""The learner worker: collects each on-policy step's scored groups, trains, publishes weights.

    attach: load the policy (the newest published version if the run already progressed)
            and publish it if the rollout workers have not got it yet
    loop:
        pull scored groups into the step ledger (each group id counted once)
        when step k has all its D_R groups:
            train on them (trainer.train_step)
            publish version k + 1, record the step as trained
            acknowledge every entry of step k, announce StepCompleted(k)

Scored entries stay unacknowledged until their step is trained and the new weights are
published, so a learner that dies mid-step gets them back (its own pending entries, or a new
learner reclaims them once the old heartbeat expires) and never trains a step twice: entries of
steps already trained are acknowledged and dropped.
"""

from __future__ import annotations

import logging
import time

import redis
import torch

from magic.common import keys, metrics as m, modeling
from magic.common.bus import ConsumerGroup, Entry, StepLedger, Stream
from magic.common.config import LearnerSettings, RunSpec, StageConfig
from magic.common.heartbeat import alive_workers
from magic.common.pb import messages_pb2 as pb
from magic.common.service import Worker
from magic.common.weights import make_sender
from magic.learner.trainer import Trainer

log = logging.getLogger(__name__)

SERVICE = "learner"
GROUP = "learner"


def run_dir(settings: LearnerSettings, run_id: str):
    return settings.data_dir / "runs" / run_id


class LearnerWorker(Worker):
    def __init__(self, r: redis.Redis, run_id: str, settings: LearnerSettings):
        self.r = r
        self.run_id = run_id
        self.settings = settings
        self.keys = keys.RunKeys(run_id)
        self.name = settings.worker_name
        self.spec = RunSpec.model_validate_json(r.get(self.keys.spec))
        self.device = torch.device(settings.device)
        self.scored = ConsumerGroup(r, self.keys.scored, GROUP, self.name, dead_stream=self.keys.dead, max_deliveries=settings.max_deliveries)
        self.scored.ensure()
        self.weights = Stream(r, self.keys.weights)
        self.events = Stream(r, self.keys.events)
        self.ledger: StepLedger[pb.ScoredGroup] = StepLedger()
        self._last_reclaim = 0.0

        last = r.hget(self.keys.learner_state, "last_step")
        self.step = int(last) + 1 if last is not None else 0  # the next step to train
        self.version = self.step  # on-policy: version k is the policy after k steps
        tokenizer = modeling.load_tokenizer(self.spec.model)
        model = modeling.load_model(self.spec.model, self.device)
        self.weight_sender = make_sender(
            settings.weight_transport,
            r=r,
            run_id=run_id,
            root=run_dir(settings, run_id) / "weights",
            stream=self.weights,
            config_json=model.config.to_json_string(),
            keep=settings.keep_weight_versions,
        )
        if self.version > 0:
            published = self.weights.last(pb.WeightUpdate)
            if published is None or published[1].version != self.version:
                raise RuntimeError(f"run {run_id}: the learner trained step {self.step - 1} but weights v{self.version} are not announced")
            modeling.load_state_dict(model, self.weight_sender.load_version(self.version))
            log.warning("resuming at step %d from weights v%d (optimizer state restarts)", self.step, self.version)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.trainer = Trainer(model, self.spec.optim, pad, self.device, settings.micro_batch_tokens)
        if self.version not in {u.version for _, u in self.weights.read_after("0", pb.WeightUpdate)}:
            self.publish()

    def status(self) -> dict:
        return {"step": self.step, "version": self.version, "collected": self.ledger.count(self.step)}

    # -- the loop ----------------------------------------------------------------------------

    def poll(self) -> None:
        entries = self._reclaim() or self.scored.read(count=64, block_ms=500)
        for entry in entries:
            self.collect(entry)
        expected = self._expected_groups(self.step)
        if expected is not None and self.ledger.is_complete(self.step, expected):
            self.train_and_publish(expected)

    def collect(self, entry: Entry) -> None:
        group = self.scored.decode(entry, pb.ScoredGroup)
        if group is None:
            return
        step = group.rollout.prompt.step
        if step < self.step:  # a late copy of a step already trained
            self.ledger.duplicates += 1
            self.scored.ack(entry.id)
            return
        if len(group.scores) != len(group.rollout.samples):
            self.scored.dead_letter(entry, f"group {group.rollout.prompt.group_id}: {len(group.scores)} scores for {len(group.rollout.samples)} samples")
            return
        self.ledger.add(step, group.rollout.prompt.group_id, entry.id, group)

    def _expected_groups(self, step: int) -> int | None:
        raw = self.r.hget(self.keys.step(step), "expected")
        return int(raw) if raw is not None else None

    def train_and_publish(self, expected: int) -> None:
        k = self.step
        batch_complete_at = time.time()
        groups, entry_ids = self.ledger.pop(k)
        stage = StageConfig.model_validate_json(self.r.hget(self.keys.step(k), "stage_config"))  # the controller's stage of step k
        t0 = time.perf_counter()
        record = self.trainer.train_step(groups[:expected], version=k, stage=stage)
        train_seconds = time.perf_counter() - t0
        record["duplicates"] = float(self.ledger.duplicates)
        m.export_step(record)
        m.VERSION_MISMATCH.inc(record["version_mismatch"])
        self.step, self.version = k + 1, k + 1
        update = self.publish()
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(self.keys.learner_state, mapping={"last_step": k, "updated_at": time.time()})
        if entry_ids:
            pipe.xack(self.scored.stream, GROUP, *entry_ids)
        pipe.execute()
        m.LEARNER_STEP.set(k)
        self.events.add(
            pb.Event(
                run_id=self.run_id,
                at=time.time(),
                source=self.name,
                step_completed=pb.StepCompleted(
                    step=k,
                    new_version=self.version,
                    metrics=record,
                    batch_complete_at=batch_complete_at,
                    train_seconds=train_seconds,
                    published_at=update.published_at,
                ),
            )
        )
        log.info(
            "step %d: reward %.3f acc %.3f entropy %.3f trained %d tokens in %.2fs -> v%d",
            k, record["reward_mean"], record["accuracy_all"], record.get("entropy", float("nan")), int(record.get("tokens_trained", 0)), train_seconds, self.version,
        )

    def publish(self) -> pb.WeightUpdate:
        """Hand the full state dict to the weight transport (it announces the version on `weights`)."""
        return self.weight_sender.publish(self.version, modeling.export_state_dict(self.trainer.model))

    def close(self) -> None:
        self.weight_sender.close()

    def _reclaim(self) -> list[Entry]:
        now = time.time()
        if now - self._last_reclaim < self.settings.heartbeat_ttl_seconds / 2:
            return []
        self._last_reclaim = now
        return self.scored.reclaim(alive_workers(self.r, SERVICE))


def run(settings: LearnerSettings | None = None) -> int:
    from magic.common.service import serve

    settings = settings or LearnerSettings()
    return serve(SERVICE, settings, lambda r, run_id: LearnerWorker(r, run_id, settings))
