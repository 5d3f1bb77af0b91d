"""Held-out validation during a run: the curves a researcher steers stages by.

Before step k when k % `validation.every` == 0, and once more for the final policy when the plan
finishes, the driver validates policy version k:

    publish every validation prompt as a GROUP_KIND_VALIDATE group (n = validation.samples,
        tau, T = validation.T or the stage's), tagged with version k, in one transaction
    rollout pods (all serving version k) generate; the reward service scores and, as for
        difficulty estimation, sends the scored group to the controller's `estimates` stream —
        never to the learner
    each scored group's outcome (correct, length, truncated per sample) is stored, then acked
    once every group is in: per dataset avg@n, pass@k with a 95% CI, mean length and truncated
        share (`magic.evaluation.summarise`) are stored under version k, exported as the
        magic_validation_* series, and merged into step k's record (`metrics.jsonl`)

Restarts. Group ids are `val:<version>:<dataset>:<index>` and the published count is written
in the MULTI that publishes them, so a restarted controller never publishes a validation twice;
outcomes are stored per group id before their entry is acknowledged (a replay writes the same
value), so nothing is counted twice; a finished validation is never run again.

The sampling seeds are the same at every version (common random numbers): the step-to-step
change of a curve then reflects the weights more than the draw.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from magic.config.schema import RunSpec, ValidationConfig
from magic.controller.datasets import DatasetRegistry, PromptRecord, group_seed, prompt_group
from magic.controller.errors import RunFailed
from magic.controller.settings import ControllerSettings
from magic.evaluation import PromptOutcome, summarise
from magic.observability import metrics as m
from magic.protocol.pb import messages_pb2 as pb
from magic.store.runs import RunStore
from magic.store.steps import StepStore, validation_scope
from magic.store.streams import ConsumerGroup, Entry

log = logging.getLogger(__name__)


def outcome_of(group: pb.ScoredGroup) -> PromptOutcome:
    """The outcome of one scored prompt group: per sample correct, response tokens, truncated at T."""
    samples = group.rollout.samples
    return PromptOutcome.of(
        [s.correctness for s in group.scores], [len(s.response_ids) for s in samples], [s.finish_reason == pb.FINISH_REASON_LENGTH for s in samples]
    )


def figures_by_dataset(outcomes: dict[str, list[PromptOutcome]], k: int) -> dict[str, dict]:
    """{dataset: figures as a dict} (the form stored, recorded and printed)."""
    return {name: summarise(rows, k).as_dict() for name, rows in sorted(outcomes.items())}


def export(figures: dict[str, dict], version: int) -> None:
    """Set the magic_validation_* series of one validation."""
    for name, f in figures.items():
        m.VALIDATION_AVG.labels(dataset=name).set(f["avg_at_n"])
        m.VALIDATION_PASS.labels(dataset=name).set(f["pass_at_k"])
        m.VALIDATION_PASS_CI.labels(dataset=name, bound="low").set(f["pass_at_k_ci_low"])
        m.VALIDATION_PASS_CI.labels(dataset=name, bound="high").set(f["pass_at_k_ci_high"])
        m.VALIDATION_LENGTH.labels(dataset=name).set(f["response_length_mean"])
        m.VALIDATION_TRUNCATED.labels(dataset=name).set(f["truncated_ratio"])
        m.VALIDATION_VERSION.labels(dataset=name).set(version)


class Validation:
    """Validates policy versions of run `store.run_id` through the rollout and reward services."""

    def __init__(self, store: RunStore, steps: StepStore, estimates: ConsumerGroup, datasets: DatasetRegistry, settings: ControllerSettings):
        self.run_id = store.run_id
        self.store = store
        self.steps = steps
        self.estimates = estimates
        self.datasets = datasets
        self.settings = settings
        self._prompts: tuple[tuple[str, ...], list[tuple[int, str, PromptRecord]]] | None = None

    def due(self, spec: RunSpec, version: int) -> bool:
        return spec.validation is not None and version % spec.validation.every == 0

    def prompts(self, cfg: ValidationConfig) -> list[tuple[int, str, PromptRecord]]:
        """(dataset index, dataset, record) of every validation prompt, read once per driver."""
        names = tuple(cfg.datasets)
        if self._prompts is None or self._prompts[0] != names:
            rows = []
            for d, name in enumerate(names):
                records = self.datasets.load(name)
                rows += [(d, name, rec) for rec in (records[: cfg.max_prompts] if cfg.max_prompts else records)]
            self._prompts = (names, rows)
        return self._prompts[1]

    def run(self, spec: RunSpec, version: int, stage_index: int, context_length: int, tick: Callable[[], None]) -> dict[str, dict]:
        """Validate policy version `version` (the rollout workers serve it) and return its figures
        per dataset; `tick` is the driver's (control requests, events — which feed `receive` —,
        the lease). A validation already finished is returned as stored."""
        cfg = spec.validation
        assert cfg is not None
        if (done := self.store.validation(version)) is not None:
            return done
        rows = self.prompts(cfg)
        published, _ = self.store.validation_progress(version)
        t = cfg.context_length or context_length
        if not published:
            groups = []
            for i, (d, name, rec) in enumerate(rows):
                sampling = pb.SamplingParams(n=cfg.samples, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=t, seed=group_seed(spec.seed, -2 - d, i))
                groups.append(prompt_group(self.run_id, rec, f"val:{version}:{name}:{i:05d}", version, stage_index, pb.GROUP_KIND_VALIDATE, sampling))
            with self.store.transaction() as tx:
                self.steps.publish_groups(tx, validation_scope(version), groups)
                self.store.validation_published(tx, version, len(groups))
            log.info("run %s: validating policy version %d on %s: %d prompts x %d samples, T=%d", self.run_id, version, ",".join(cfg.datasets), len(rows), cfg.samples, t)
        started = time.monotonic()
        while True:
            published, received = self.store.validation_progress(version)
            if len(received) >= published:
                break
            if time.monotonic() - started > self.settings.step_timeout_seconds:
                raise RunFailed(f"validation of version {version}: {len(received)}/{published} prompt groups scored after {self.settings.step_timeout_seconds:.0f}s")
            tick()
        outcomes: dict[str, list[PromptOutcome]] = {name: [] for name in cfg.datasets}
        for raw in received.values():
            o = json.loads(raw)
            outcomes[o["dataset"]].append(PromptOutcome(tuple(o["correct"]), tuple(o["lengths"]), tuple(o["truncated"])))
        figures = figures_by_dataset(outcomes, cfg.k)
        for f in figures.values():
            f["seconds"] = time.monotonic() - started  # wall time of this version's validation, all datasets together
        self.store.finish_validation(version, figures)
        export(figures, version)
        log.info(
            "run %s: policy version %d: %s", self.run_id, version,
            "; ".join(f"{n} avg@{f['samples']} {f['avg_at_n']:.3f} pass@{f['k']} {f['pass_at_k']:.3f}" for n, f in figures.items()),
        )
        return figures

    def receive(self, batch: list[tuple[Entry, pb.ScoredGroup]]) -> None:
        """Store the outcomes of scored validation groups (from the `estimates` stream), then
        acknowledge them; a group the controller did not publish is dead-lettered."""
        by_version: dict[int, dict[str, str]] = {}
        for entry, group in batch:
            prompt = group.rollout.prompt
            if (problem := self.steps.check_group(prompt)) is not None or len(group.scores) != prompt.sampling.n:
                self.estimates.dead_letter(entry, problem or f"validation group {prompt.group_id}: {len(group.scores)} scores for {prompt.sampling.n} samples")
                continue
            version = int(prompt.policy_version)
            if self.store.validation(version) is not None:
                continue  # a replay of a finished validation
            o = outcome_of(group)
            dataset = prompt.group_id.split(":")[2]
            by_version.setdefault(version, {})[prompt.group_id] = json.dumps(
                {"dataset": dataset, "uid": prompt.prompt_uid, "correct": o.correct, "lengths": o.lengths, "truncated": o.truncated}
            )
        for version, outcomes in by_version.items():
            self.store.record_validation_outcomes(version, outcomes)
        self.estimates.ack(*(entry.id for entry, _ in batch))
