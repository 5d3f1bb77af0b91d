"""A run's plan: which stage a step belongs to, when a stage ends, and online filtering.

A stage ends after its `steps` or when its plateau rule fires (`stage_end_reason`). The next
stage starts with online filtering (§3.1 of the report): the prompts that were solved in every
sample of every group during the previous stage are dropped from then on. The controller learns
that from the `scored` stream, read with its own consumer group (the learner's is untouched):
per stage and prompt a hash remembers whether every sample so far was correct. A stage start
(the prompts it drops, the previous stage's end, its record) is one transaction (`RunStore`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from magic.config.schema import RunSpec, StageConfig
from magic.controller.datasets import PromptRecord, PromptSource
from magic.controller.errors import RunFailed
from magic.protocol import codec
from magic.protocol.pb import messages_pb2 as pb
from magic.store.runs import RunStore
from magic.store.steps import StepStore
from magic.store.streams import ConsumerGroup

log = logging.getLogger(__name__)


def may_end(stage: StageConfig, done: int) -> bool:
    """Whether a stage with `done` finished steps may end now (its step count is reached, or its
    plateau rule has the steps it compares): before, it goes on whatever their records say."""
    rule = stage.plateau
    return done >= stage.steps or (rule is not None and done >= max(rule.min_steps, 2 * rule.window))


def stage_end_reason(stage: StageConfig, done: list[dict]) -> str | None:
    """Why a stage whose finished steps have the records `done` ends now, or None if it goes on."""
    if len(done) >= stage.steps:
        return "steps"
    rule = stage.plateau
    if rule is None or not may_end(stage, len(done)):
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


class StagePlan:
    """The stages of run `run_id` over the prompt pool, with online filtering between them."""

    def __init__(self, run: RunStore, steps: StepStore, scored: ConsumerGroup):
        self.run_id = run.run_id
        self.store = run
        self.steps = steps
        self.scored = scored
        self._stage: CurrentStage | None = None

    def stage_for(self, spec: RunSpec, k: int, pool: list[PromptRecord]) -> CurrentStage | None:
        """The stage step k belongs to, starting the next stage (with online filtering) when the
        current one has ended; None when the plan has no stage left."""
        state = self.store.state()
        index, start = int(state.get("stage", -1)), int(state.get("stage_start", 0))
        reason = None
        if index >= 0:
            stage = spec.stages[index]
            reason = stage_end_reason(stage, self.store.metrics(since=start))
            if reason is None:
                if self._stage is None or self._stage.index != index:
                    self._stage = CurrentStage(index, stage, start, self.source(spec, index, pool))
                return self._stage
        if index + 1 >= len(spec.stages):
            if index >= 0:
                self.store.close_stage(index, k, reason)
            return None
        return self._start(spec, index + 1, k, reason, pool)

    def _start(self, spec: RunSpec, index: int, k: int, prev_reason: str | None, pool: list[PromptRecord]) -> CurrentStage:
        stage = spec.stages[index]
        self.drain_scored()  # every scored group of the previous stage is in (its last step completed)
        dropped = self.store.dropped()
        newly: list[str] = []
        if index > 0 and stage.online_filter:
            newly = sorted(self.store.solved(index - 1) - set(dropped))
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
        self.store.start_stage(record, prev_reason, newly)
        log.info(
            "run %s: stage %d '%s' starts at step %d (T=%d, D_R=%d, gs=%d): %d prompts, %d dropped by online filtering",
            self.run_id, index, stage.name, k, stage.context_length, stage.rollout_batch_size, stage.group_size, remaining, len(newly),
        )
        self._stage = CurrentStage(index, stage, k, self.source(spec, index, pool))
        return self._stage

    def source(self, spec: RunSpec, index: int, pool: list[PromptRecord]) -> PromptSource:
        """Stage `index`'s prompts: the pool less what was dropped from this stage on."""
        dropped = {u for u, d in self.store.dropped().items() if d["from_stage"] <= index}
        return PromptSource([rec for rec in pool if rec.uid not in dropped], spec.seed * 1009 + index)

    # -- online filtering: the outcomes of scored groups ---------------------------------------

    def drain_scored(self) -> None:
        while self.read_scored(block_ms=0) > 0:
            pass

    def read_scored(self, block_ms: int = 0) -> int:
        """Record per-prompt outcomes of scored groups: all samples correct or not, per stage."""
        entries = self.scored.reclaim_from_others_if_due(1.0) + self.scored.read(count=500, block_ms=block_ms or None)
        if not entries:
            return 0
        outcomes = []
        for entry in entries:
            try:
                group = codec.decode(entry.fields, pb.ScoredGroup)
            except codec.PoisonMessage:
                continue  # the learner dead-letters it; nothing to learn here
            prompt = group.rollout.prompt
            if not prompt.prompt_uid or not group.scores or self.steps.check_group(prompt) is not None:
                continue  # a group we did not publish (the learner dead-letters it) must not drop a prompt
            outcomes.append((prompt.stage, prompt.prompt_uid, all(s.correctness >= 1.0 for s in group.scores)))
        self.store.record_outcomes(outcomes)
        self.scored.ack(*(e.id for e in entries))
        return len(entries)
