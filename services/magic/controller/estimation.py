"""Offline difficulty estimation (§6 of the report), before a run's first step.

Every prompt is sampled N times with the initial policy (N per data source:
`EstimationConfig.samples_for`), its pass rate is stored, and the prompts solved 0/N or N/N are
dropped from stage 0 on. Estimation groups go through rollout and reward like training groups,
tagged `GROUP_KIND_ESTIMATE`; the reward service sends their scores to the `estimates` stream
instead of the learner. Resumable: what was published and what came back are in Redis, each
pass rate stored (idempotently) before its entry is acknowledged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from magic.config.schema import RunSpec
from magic.controller.datasets import PromptRecord, group_seed, prompt_group
from magic.controller.errors import RunFailed
from magic.controller.settings import ControllerSettings
from magic.protocol.pb import messages_pb2 as pb
from magic.store.runs import RunStore
from magic.store.steps import ESTIMATION, StepStore
from magic.store.streams import ConsumerGroup

log = logging.getLogger(__name__)


class DifficultyEstimation:
    def __init__(self, run: RunStore, steps: StepStore, estimates: ConsumerGroup, settings: ControllerSettings):
        self.run_id = run.run_id
        self.store = run
        self.steps = steps
        self.estimates = estimates
        self.settings = settings

    def run(self, spec: RunSpec, pool: list[PromptRecord], k: int, tick: Callable[[], None], wait_for_version: Callable[[int], float]) -> None:
        """Estimate the pass rate of every prompt with policy version k and drop the prompts solved
        0/N or N/N. `tick` is the driver's: control requests, events, the lease."""
        cfg = spec.estimation
        assert cfg is not None
        prompts = pool[: cfg.max_prompts] if cfg.max_prompts else pool
        total = len(prompts)
        self.store.begin_estimation(total, cfg.samples)
        deadline = time.monotonic() + self.settings.step_timeout_seconds
        log.info("run %s: difficulty estimation of %d prompts, N=%d, T=%d", self.run_id, total, cfg.samples, cfg.context_length)
        while True:
            tick()
            self._read_estimates()
            published, received = self.store.estimation_progress()
            if received >= total:
                break
            if published < total and published - received < cfg.groups_per_batch:
                wait_for_version(k)
                batch = prompts[published: published + cfg.groups_per_batch]
                groups = [
                    prompt_group(
                        self.run_id, rec, f"est:{i:07d}", k, -1, pb.GROUP_KIND_ESTIMATE,
                        pb.SamplingParams(n=cfg.samples_for(rec.data_source), temperature=cfg.temperature, top_p=1.0,
                                          max_tokens=cfg.context_length, seed=group_seed(spec.seed, -1, i)),
                    )
                    for i, rec in enumerate(batch, published)
                ]
                with self.store.transaction() as tx:
                    self.steps.publish_groups(tx, ESTIMATION, groups)
                    self.store.estimation_published(tx, published + len(batch))
            if time.monotonic() > deadline:
                raise RunFailed(f"difficulty estimation: {received}/{total} prompts scored after {self.settings.step_timeout_seconds:.0f}s")
        self._finish()

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

    def _read_estimates(self) -> None:
        for entry in self.estimates.reclaim_from_others_if_due(1.0) + self.estimates.read(count=200, block_ms=200):
            group = self.estimates.decode(entry, pb.ScoredGroup)
            if group is None:
                continue
            if group.rollout.prompt.kind != pb.GROUP_KIND_ESTIMATE:  # validation starts after the estimation
                self.estimates.dead_letter(entry, "a validation result during the difficulty estimation")
                continue
            correct = sum(1 for s in group.scores if s.correctness >= 1.0)
            self.store.record_pass_rate(group.rollout.prompt.prompt_uid, correct, len(group.scores))
            self.estimates.ack(entry.id)
