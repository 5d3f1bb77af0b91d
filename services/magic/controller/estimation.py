"""Offline difficulty estimation (§6 of the report), before a run's first step.

Every prompt is sampled N times with the initial policy (N per data source:
`EstimationConfig.samples_for`), its pass rate is stored, and the prompts solved 0/N or N/N are
dropped from stage 0 on. Estimation groups go through rollout and reward like training groups,
tagged `GROUP_KIND_ESTIMATE`; the reward service sends their scores to the `estimates` stream
instead of the learner. Resumable: what was published and what came back are in Redis, each
pass rate stored (idempotently) before its entry is acknowledged. A side job
(`magic.controller.sidejobs`): the driver advances it and routes its scored groups to `receive`.
"""

from __future__ import annotations

import logging
import time

from magic.config.schema import RunSpec
from magic.controller.datasets import PromptRecord, group_seed, prompt_group
from magic.controller.errors import RunFailed
from magic.controller.settings import ControllerSettings
from magic.protocol.pb import messages_pb2 as pb
from magic.store.runs import RunStore
from magic.store.steps import ESTIMATION, StepStore
from magic.store.streams import ConsumerGroup, Entry

log = logging.getLogger(__name__)


class DifficultyEstimation:
    """The estimation of run `run.run_id` with policy version k, as a side job
    (`magic.controller.sidejobs`): `advance` keeps at most `groups_per_batch` groups out and
    finishes once every prompt's pass rate is in; `receive` stores the scored
    GROUP_KIND_ESTIMATE groups."""

    def __init__(self, run: RunStore, steps: StepStore, estimates: ConsumerGroup, settings: ControllerSettings, spec: RunSpec, pool: list[PromptRecord], k: int):
        self.run_id = run.run_id
        self.store = run
        self.steps = steps
        self.estimates = estimates
        self.settings = settings
        self.spec, self.version = spec, k
        cfg = spec.estimation
        assert cfg is not None
        self.cfg = cfg
        self.prompts = pool[: cfg.max_prompts] if cfg.max_prompts else pool
        self.deadline: float | None = None

    def advance(self) -> bool:
        """Publish the next batch while fewer than `groups_per_batch` groups are out; True once
        every prompt's pass rate is in (the prompts solved 0/N or N/N are then dropped)."""
        cfg, total = self.cfg, len(self.prompts)
        if self.deadline is None:
            self.store.begin_estimation(total, cfg.samples)
            self.deadline = time.monotonic() + self.settings.step_timeout_seconds
            log.info("run %s: difficulty estimation of %d prompts, N=%d, T=%d", self.run_id, total, cfg.samples, cfg.context_length)
        published, received = self.store.estimation_progress()
        if received >= total:
            self._finish()
            return True
        if published < total and published - received < cfg.groups_per_batch:
            batch = self.prompts[published: published + cfg.groups_per_batch]
            groups = [
                prompt_group(
                    self.run_id, rec, f"est:{i:07d}", self.version, -1, pb.GROUP_KIND_ESTIMATE,
                    pb.SamplingParams(n=cfg.samples_for(rec.data_source), temperature=cfg.temperature, top_p=1.0,
                                      max_tokens=cfg.context_length, seed=group_seed(self.spec.seed, -1, i)),
                )
                for i, rec in enumerate(batch, published)
            ]
            with self.store.transaction() as tx:
                self.steps.publish_groups(tx, ESTIMATION, groups)
                self.store.estimation_published(tx, published + len(batch))
        if time.monotonic() > self.deadline:
            raise RunFailed(f"difficulty estimation: {received}/{total} prompts scored after {self.settings.step_timeout_seconds:.0f}s")
        return False

    def result(self) -> None:
        return None

    def _finish(self) -> None:
        rates = self.store.pass_rates()
        dropped = self.store.dropped()
        counts = {"estimated_0": 0, "estimated_all": 0}
        drop = {}
        for uid, rate in rates.items():
            correct, n = (int(x) for x in rate.split("/"))
            reason = "estimated_0" if correct == 0 else "estimated_all" if correct == n else None
            if reason:
                counts[reason] += 1
                if uid not in dropped:
                    drop[uid] = reason
        self.store.finish_estimation(drop, {"received": len(rates), "dropped_0": counts["estimated_0"], "dropped_all": counts["estimated_all"]})
        log.info("run %s: estimation done: %d prompts solved 0/N, %d solved N/N dropped", self.run_id, counts["estimated_0"], counts["estimated_all"])

    def receive(self, batch: list[tuple[Entry, pb.ScoredGroup]]) -> None:
        """Store the pass rate of each scored estimation group, then acknowledge it (a replay
        stores the same value); a group the controller did not publish is dead-lettered."""
        for entry, group in batch:
            prompt = group.rollout.prompt
            if (problem := self.steps.check_group(prompt)) is not None:
                self.estimates.dead_letter(entry, problem)
                continue
            correct = sum(1 for s in group.scores if s.correctness >= 1.0)
            self.store.record_pass_rate(prompt.prompt_uid, correct, len(group.scores))
            self.estimates.ack(entry.id)
