"""Held-out evaluation through the services: a run's validation curve and `magic eval --run`.

One code path (`Evaluation`, a side job: `magic.controller.sidejobs`) evaluates a policy version on
registered datasets:

    publish every prompt as a GROUP_KIND_VALIDATE group (n = samples, tau, T), tagged with the
        version, in one transaction
    rollout pods (all serving that version) generate; the reward service scores and, as for
        difficulty estimation, sends the scored group to the controller's `estimates` stream —
        never to the learner
    each scored group's outcome (correct, length, truncated per sample) is stored, then acked
    once every group is in: per dataset avg@n, pass@k with a 95% CI, mean length and truncated
        share (`magic.evaluation.summarise`)

Two callers, two scopes (`Scope`: where the groups' digests and the outcomes are kept):

- step validation (`Validation.job`): before step k when k % `validation.every` == 0, and once more for the
  final policy when the plan finishes; group ids `val:<version>:<dataset>:<index>`; the figures
  are stored under version k, exported as the magic_validation_* series and merged into step k's
  record (`metrics.jsonl`); the samples of the first `dump_prompts` prompts of each dataset are
  appended as they come to a partial file on the data volume (never to Redis), which becomes
  `generations/step-<k>.jsonl` (a replay's copies dropped, in prompt order) once all are in;
- requested evaluations (`Validation.eval_job`, POST /v1/runs/{run}/evals): served by the driver at the
  next step boundary, or at once while the run is paused or waits for a stage, on the version the
  rollout workers serve then; group ids `eval:<id>:<dataset>:<index>`; the figures go into the
  eval's record (GET /v1/runs/{run}/evals/{id}), not into the step records or the series.

Restarts. Group ids are deterministic and the published count is written in the MULTI that
publishes them (with, for an eval, its status `running` and the version it evaluates), so a
restarted controller never publishes an evaluation twice; outcomes are stored per group id before
their entry is acknowledged (a replay writes the same value), so nothing is counted twice; a
finished evaluation is never run again.

The sampling seeds are the same at every version and for every scope (common random numbers): the
step-to-step change of a curve then reflects the weights more than the draw, and an eval of the
version a validation saw draws the same samples.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from magic.config.schema import EvalConfig, RunSpec, ValidationConfig
from magic.controller.datasets import DatasetError, DatasetRegistry, PromptRecord, group_seed, prompt_group
from magic.controller.errors import RunFailed
from magic.controller.settings import ControllerSettings
from magic.controller.sidejobs import Done, SideJob
from magic.evaluation import PromptOutcome, summarise
from magic.observability import metrics as m
from magic.protocol.layout import checkpoint_name
from magic.protocol.pb import messages_pb2 as pb
from magic.runtime.files import write_durably
from magic.store.runs import RunStore
from magic.store.steps import StepStore, eval_scope, validation_scope
from magic.store.streams import ConsumerGroup, Entry

log = logging.getLogger(__name__)

EVAL_OPEN = ("pending", "running")
"""Statuses of a requested evaluation the driver has still to serve."""
DUMP_RESPONSE_CHARS = 65_536
"""A response written to a generations file is cut at this many characters."""


class EvaluationTimeout(RunFailed):
    """Not every group of an evaluation was scored within the step timeout."""


@dataclass(frozen=True)
class Scope:
    """Where one evaluation lives: `key` files its groups' digests (`RunKeys.groups`) and its
    outcomes (`RunKeys.evaluation`), `prefix` starts its group ids, `version` is the policy
    version it evaluates."""

    key: str
    prefix: str
    version: int

    @classmethod
    def validation(cls, version: int) -> "Scope":
        return cls(validation_scope(version), f"val:{version}", version)

    @classmethod
    def eval(cls, eval_id: str, version: int) -> "Scope":
        return cls(eval_scope(eval_id), f"eval:{eval_id}", version)


def outcome_of(group: pb.ScoredGroup) -> PromptOutcome:
    """The outcome of one scored prompt group: per sample correct, response tokens, truncated at T."""
    samples = group.rollout.samples
    return PromptOutcome.of(
        [s.correctness for s in group.scores], [len(s.response_ids) for s in samples], [s.finish_reason == pb.FINISH_REASON_LENGTH for s in samples],
        [s.answer for s in group.scores],
    )


def generations_of(group: pb.ScoredGroup) -> list[dict]:
    """One JSON row per sample of a scored held-out group: what a reader of the generations
    file needs beside the figures."""
    prompt = group.rollout.prompt
    question = next((m.content for m in reversed(prompt.messages) if m.role == "user"), "")
    return [
        {
            "uid": prompt.prompt_uid, "data_source": prompt.data_source, "sample": i, "prompt": question, "ground_truth": prompt.ground_truth,
            "response": s.text[:DUMP_RESPONSE_CHARS], "answer": score.answer, "verdict": pb.Verdict.Name(score.verdict).removeprefix("VERDICT_").lower(),
            "correct": score.correctness >= 1.0, "tokens": len(s.response_ids), "truncated": s.finish_reason == pb.FINISH_REASON_LENGTH,
            "policy_version": int(s.policy_version),
        }
        for i, (s, score) in enumerate(zip(group.rollout.samples, group.scores))
    ]


def generations_path(run_dir: Path, version: int, partial: bool = False) -> Path:
    """The generations file of the validation of `version` (`partial`: the one rows are appended
    to while its groups come in)."""
    name = f"{checkpoint_name(version)}.jsonl"
    return run_dir / "generations" / (f".{name}.partial" if partial else name)


def append_generations(path: Path, group_id: str, dataset: str, rows: list[dict]) -> None:
    """Append one scored group's rows to the partial file `path` (a replayed group: again; a line
    cut by a crash: skipped when the file is finished)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write("".join(json.dumps({"group_id": group_id, "dataset": dataset, **row}, ensure_ascii=False) + "\n" for row in rows))


def finish_generations(partial: Path, final: Path) -> int:
    """Turn the partial file into the generations file: each (group, sample) once, in prompt order
    (the group ids' index), written atomically; returns the rows written (none: no file)."""
    if not partial.exists():
        return len(final.read_text().splitlines()) if final.exists() else 0
    rows: dict[tuple[int, int], dict] = {}
    for line in partial.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
            key = (int(row["group_id"].rsplit(":", 1)[-1]), int(row["sample"]))
        except (ValueError, KeyError, AttributeError):
            continue  # a line a crash cut short: its group's replay wrote it whole
        rows.setdefault(key, row)
    text = "".join(json.dumps({k: v for k, v in row.items() if k != "group_id"}, ensure_ascii=False) + "\n" for _, row in sorted(rows.items()))
    write_durably(final, text)
    partial.unlink()
    return len(rows)


def figures_by_dataset(outcomes: dict[str, list[PromptOutcome]], k: int, sources: dict[str, list[str]] | None = None) -> dict[str, dict]:
    """{dataset: figures as a dict} (the form stored, recorded and printed); a dataset whose prompts
    come from several `data_source`s (`sources`: one per outcome) also gets the figures of each,
    under `by_data_source`.

    >>> o = [PromptOutcome((True, False), (3, 4), (False, False)), PromptOutcome((True, True), (2, 2), (False, False))]
    >>> f = figures_by_dataset({"mix": o}, 1, {"mix": ["aime", "math"]})
    >>> f["mix"]["avg_at_n"], f["mix"]["by_data_source"]["aime"]["avg_at_n"], f["mix"]["by_data_source"]["math"]["avg_at_n"]
    (0.75, 0.5, 1.0)
    """
    out = {}
    for name, rows in sorted(outcomes.items()):
        out[name] = summarise(rows, k).as_dict()
        labels = (sources or {}).get(name)
        if labels and len(set(labels)) > 1:
            split: dict[str, list[PromptOutcome]] = {}
            for label, row in zip(labels, rows):
                split.setdefault(label or "(none)", []).append(row)
            out[name]["by_data_source"] = {label: summarise(part, k).as_dict() for label, part in sorted(split.items())}
    return out


def best(cfg: ValidationConfig | None, validations: dict[int, dict[str, dict]]) -> tuple[int, float] | None:
    """(policy version, figure) of the best validation by `cfg.best_by` (the first of equals: a
    later one must beat it), or None (no `best_by`, no validation yet, or none has the figure).

    >>> cfg = ValidationConfig(datasets=["a"], best_by="avg_at_n")
    >>> best(cfg, {0: {"a": {"avg_at_n": 0.2}}, 10: {"a": {"avg_at_n": 0.5}}, 20: {"a": {"avg_at_n": 0.5}}})
    (10, 0.5)
    """
    if cfg is None or not cfg.best_by:
        return None
    top = None
    for version, figures in sorted(validations.items()):
        try:
            value = cfg.best_figure(figures)
        except (KeyError, TypeError, ValueError):  # a validation of another dataset list (a spec edited since)
            continue
        if value is not None and (top is None or value > top[1]):
            top = (version, value)
    return top


def export(figures: dict[str, dict], version: int) -> None:
    """Set the magic_validation_* series of one validation."""
    for name, f in figures.items():
        m.VALIDATION_AVG.labels(dataset=name).set(f["avg_at_n"])
        m.VALIDATION_PASS.labels(dataset=name).set(f["pass_at_k"])
        if f.get("maj_at_n") is not None:
            m.VALIDATION_MAJ.labels(dataset=name).set(f["maj_at_n"])
        m.VALIDATION_PASS_CI.labels(dataset=name, bound="low").set(f["pass_at_k_ci_low"])
        m.VALIDATION_PASS_CI.labels(dataset=name, bound="high").set(f["pass_at_k_ci_high"])
        m.VALIDATION_LENGTH.labels(dataset=name).set(f["response_length_mean"])
        m.VALIDATION_TRUNCATED.labels(dataset=name).set(f["truncated_ratio"])
        m.VALIDATION_VERSION.labels(dataset=name).set(version)


class Validation:
    """Evaluates policy versions of run `store.run_id` through the rollout and reward services:
    the run's validation (`job`) and requested evaluations (`eval_job`), both an `Evaluation`; the
    receiver of the scored GROUP_KIND_VALIDATE groups (`receive`)."""

    def __init__(self, store: RunStore, steps: StepStore, estimates: ConsumerGroup, datasets: DatasetRegistry, settings: ControllerSettings):
        self.run_id = store.run_id
        self.store = store
        self.steps = steps
        self.estimates = estimates
        self.datasets = datasets
        self.settings = settings
        self._prompts: dict[tuple[tuple[str, ...], int | None], list[tuple[int, str, PromptRecord]]] = {}

    def due(self, spec: RunSpec, version: int) -> bool:
        """Is policy version `version` validated (before step `version`)? Every `every`-th, the
        initial model (version 0) only with `before_training`."""
        cfg = spec.validation
        return cfg is not None and version % cfg.every == 0 and (version > 0 or cfg.before_training)

    def prompts(self, cfg: EvalConfig) -> list[tuple[int, str, PromptRecord]]:
        """(dataset index, dataset, record) of every prompt to evaluate, read once per driver."""
        key = (tuple(cfg.datasets), cfg.max_prompts)
        if key not in self._prompts:
            rows = []
            for d, name in enumerate(cfg.datasets):
                records = self.datasets.load(name)
                rows += [(d, name, rec) for rec in (records[: cfg.max_prompts] if cfg.max_prompts else records)]
            self._prompts[key] = rows
        return self._prompts[key]

    def evaluation(self, scope: Scope, cfg: EvalConfig, seed: int, stage_index: int, t: int, on_publish: Callable[[object], None] | None = None) -> "Evaluation":
        """The side job that evaluates policy version `scope.version` with T = `t` (see `Evaluation`)."""
        return Evaluation(self, scope, cfg, seed, stage_index, t, on_publish)

    def _dumped(self) -> dict[str, int]:
        """{dataset: the global group index up to which its prompts' samples are dumped}: the first
        `dump_prompts` prompts of each dataset of the run's validation ({} without dumps)."""
        spec = self.store.spec()
        cfg = spec.validation if spec is not None else None
        if cfg is None or not cfg.dump_prompts:
            return {}
        first: dict[str, int] = {}
        for i, (_, name, _) in enumerate(self.prompts(cfg)):
            first.setdefault(name, i)
        return {name: start + cfg.dump_prompts for name, start in first.items()}

    def restore_series(self) -> None:
        """Set the magic_validation_* series from the newest stored validation (a controller that
        restarted between validations shows the last curve point, not nothing)."""
        if done := self.store.validations():
            version = max(done)
            export(done[version], version)

    def job(self, spec: RunSpec, version: int, stage_index: int, context_length: int) -> SideJob:
        """The side job that validates policy version `version` with the run's validation block
        (T: its own or the stage's `context_length`); its result, the figures, is stored and
        exported. A validation already finished is done at once with the stored figures."""
        cfg = spec.validation
        assert cfg is not None
        if (done := self.store.validation(version)) is not None:
            return Done(done)
        return self.evaluation(Scope.validation(version), cfg, spec.seed, stage_index, cfg.context_length or context_length).then(
            lambda figures: self._finish_validation(version, cfg, figures)
        )

    def _finish_validation(self, version: int, cfg: ValidationConfig, figures: dict[str, dict]) -> dict[str, dict]:
        if cfg.dump_prompts:  # before `finish_validation`: a controller restarted meanwhile finishes the same file
            path = generations_path(self.store.run_dir, version)
            rows = finish_generations(generations_path(self.store.run_dir, version, partial=True), path)
            log.info("run %s: %d generations of policy version %d written to %s", self.run_id, rows, version, path)
        self.store.finish_validation(version, figures)
        export(figures, version)
        return figures

    def eval_job(self, spec: RunSpec, record: dict, version: int, stage_index: int, context_length: int | None) -> SideJob:
        """The side job that serves requested evaluation `record` (pending: on policy version
        `version`, T its own or `context_length`; running: on the version and T it started with)
        and stores its end: the figures, or why it failed (a dataset gone, groups not scored in
        time) — its result is the eval's record either way. The run goes on; a failure of the
        run itself (a worker error, a stop) is the driver's."""
        eval_id = record["id"]
        cfg = EvalConfig.model_validate(record["config"])
        if record["status"] == "running":
            version, t = int(record["policy_version"]), int(record["context_length"])
        else:
            t = cfg.context_length or context_length

        def failed(exc: Exception) -> dict:
            log.warning("run %s: eval %s failed: %s", self.run_id, eval_id, exc)
            self.store.end_eval(eval_id, error=str(exc))
            return self.store.eval(eval_id) or {}

        def done(figures: dict[str, dict]) -> dict:
            self.store.end_eval(eval_id, figures)
            return self.store.eval(eval_id) or {}

        if t is None:
            return Done(failed(DatasetError("no T: the run has no stage yet and the eval gives no context_length")))
        job = self.evaluation(Scope.eval(eval_id, version), cfg, spec.seed, stage_index, t, on_publish=lambda tx: self.store.start_eval(tx, record, version, t))
        return job.then(done, on_error=failed)

    def receive(self, batch: list[tuple[Entry, pb.ScoredGroup]]) -> None:
        """Store the outcomes of scored held-out groups (from the `estimates` stream), then
        acknowledge them; a group the controller did not publish is dead-lettered, a group of a
        finished evaluation (a replay) only acknowledged."""
        by_scope: dict[str, dict[str, str]] = {}
        dump: dict[str, int] | None = None  # dataset -> global index of its first prompt past the dumped ones; read once per batch
        for entry, group in batch:
            prompt = group.rollout.prompt
            kind, ident, dataset = (prompt.group_id.split(":") + ["", ""])[:3]
            record = self.store.eval(ident) if kind == "eval" else None
            if record is not None and record.get("status") not in EVAL_OPEN:
                continue  # a replay of a finished eval (its group digests went with it: `RunStore.end_eval`)
            if (problem := self.steps.check_group(prompt)) is not None or len(group.scores) != prompt.sampling.n:
                self.estimates.dead_letter(entry, problem or f"held-out group {prompt.group_id}: {len(group.scores)} scores for {prompt.sampling.n} samples")
                continue
            if kind == "eval":
                scope = eval_scope(ident)  # published, so its record exists and is open (checked above)
            else:
                scope = validation_scope(int(prompt.policy_version))
                if self.store.validation(int(prompt.policy_version)) is not None:
                    continue  # a replay of a finished validation
            o = outcome_of(group)
            if kind == "val":
                if dump is None:
                    dump = self._dumped()
                if int(prompt.group_id.rsplit(":", 1)[-1]) < dump.get(dataset, 0):
                    partial = generations_path(self.store.run_dir, int(prompt.policy_version), partial=True)
                    append_generations(partial, prompt.group_id, dataset, generations_of(group))  # before the outcome: a replay writes it again
            by_scope.setdefault(scope, {})[prompt.group_id] = json.dumps(
                {"dataset": dataset, "uid": prompt.prompt_uid, "data_source": prompt.data_source, "correct": o.correct, "lengths": o.lengths, "truncated": o.truncated, "answers": o.answers}
            )
        for scope, outcomes in by_scope.items():
            self.store.record_evaluation_outcomes(scope, outcomes)
        self.estimates.ack(*(entry.id for entry, _ in batch))


class Evaluation:
    """One evaluation of a policy version through the rollout and reward services, as a side job
    (`magic.controller.sidejobs`):

        advance: publish every prompt as a GROUP_KIND_VALIDATE group (n = samples, tau, T), tagged
                 with the version, in one transaction (once: the published count is in Redis);
                 then: done once every group's outcome is stored (`Validation.receive`)
        result:  per dataset avg@n, maj@n, pass@k with its CI, mean length, truncated share

    Raises `EvaluationTimeout` from `advance` when not every group is scored within the step
    timeout, `DatasetError` when a dataset cannot be read; `then` chains what its result becomes
    (stored as a validation, or as an eval's record)."""

    def __init__(self, validation: Validation, scope: Scope, cfg: EvalConfig, seed: int, stage_index: int, t: int, on_publish: Callable[[object], None] | None = None):
        self.v, self.scope, self.cfg, self.seed, self.stage_index, self.t, self.on_publish = validation, scope, cfg, seed, stage_index, t, on_publish
        self.version = scope.version
        self.started: float | None = None
        self._received: dict[str, str] = {}
        self._then: Callable[[dict[str, dict]], object] | None = None
        self._on_error: Callable[[Exception], object] | None = None
        self._failed: object = None
        self._is_failed = False

    def then(self, done: Callable[[dict[str, dict]], object], on_error: Callable[[Exception], object] | None = None) -> "Evaluation":
        """`done(figures)` becomes the result; with `on_error`, a dataset that cannot be read or a
        timeout ends the job with `on_error(exc)` as its result instead of raising."""
        self._then, self._on_error = done, on_error
        return self

    def advance(self) -> bool:
        try:
            return self._advance()
        except (DatasetError, EvaluationTimeout) as exc:
            if self._on_error is None:
                raise
            self._failed, self._is_failed = self._on_error(exc), True
            return True

    def _advance(self) -> bool:
        store, scope = self.v.store, self.scope
        if self.started is None:
            self.started = time.monotonic()
            published, _ = store.evaluation_progress(scope.key)
            if not published:
                self._publish()
        published, received = store.evaluation_progress(scope.key)
        if len(received) >= published:
            self._received = received
            return True
        if time.monotonic() - self.started > self.v.settings.step_timeout_seconds:
            raise EvaluationTimeout(f"{scope.key} (policy version {scope.version}): {len(received)}/{published} prompt groups scored after {self.v.settings.step_timeout_seconds:.0f}s")
        return False

    def _publish(self) -> None:
        v, scope, cfg = self.v, self.scope, self.cfg
        rows = v.prompts(cfg)
        groups = []
        for i, (d, name, rec) in enumerate(rows):
            sampling = pb.SamplingParams(n=cfg.samples, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=self.t, seed=group_seed(self.seed, -2 - d, i))
            groups.append(prompt_group(v.run_id, rec, f"{scope.prefix}:{name}:{i:05d}", scope.version, self.stage_index, pb.GROUP_KIND_VALIDATE, sampling))
        with v.store.transaction() as tx:
            v.steps.publish_groups(tx, scope.key, groups)
            v.store.evaluation_published(tx, scope.key, len(groups))
            if self.on_publish is not None:
                self.on_publish(tx)
        log.info("run %s: %s: policy version %d on %s: %d prompts x %d samples, T=%d", v.run_id, scope.key, scope.version, ",".join(cfg.datasets), len(rows), cfg.samples, self.t)

    def result(self) -> object:
        if self._is_failed:
            return self._failed
        figures = self._figures()
        return self._then(figures) if self._then is not None else figures

    def _figures(self) -> dict[str, dict]:
        cfg, scope = self.cfg, self.scope
        outcomes: dict[str, list[PromptOutcome]] = {name: [] for name in cfg.datasets}
        sources: dict[str, list[str]] = {name: [] for name in cfg.datasets}
        for raw in self._received.values():
            o = json.loads(raw)
            outcomes[o["dataset"]].append(PromptOutcome(tuple(o["correct"]), tuple(o["lengths"]), tuple(o["truncated"]), tuple(o.get("answers", ()))))
            sources[o["dataset"]].append(o.get("data_source", ""))
        figures = figures_by_dataset(outcomes, cfg.k, sources)
        for f in figures.values():
            f["seconds"] = time.monotonic() - (self.started or time.monotonic())  # wall time of this evaluation, all datasets together
            # what a reader of the record needs beside n and k: T, tau, top-p and the version evaluated
            f.update(T=self.t, temperature=cfg.temperature, top_p=cfg.top_p, policy_version=scope.version)
        log.info(
            "run %s: %s: policy version %d: %s", self.v.run_id, scope.key, scope.version,
            "; ".join(f"{n} avg@{f['samples']} {f['avg_at_n']:.3f} pass@{f['k']} {f['pass_at_k']:.3f}" for n, f in figures.items()),
        )
        return figures
