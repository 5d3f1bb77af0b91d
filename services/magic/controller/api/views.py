"""The response shapes of runs: status (from Redis and heartbeats), stage records, filtering counts."""

from __future__ import annotations

from pydantic import BaseModel

from magic.config.schema import RunSpec
from magic.controller.api.deps import Controller, spec_or_404
from magic.controller.validation import best
from magic.protocol.layout import CHECKPOINT_MANIFEST, checkpoint_name, checkpoint_root
from magic.protocol.status import Phase, RunStatus

THROUGHPUT_STEPS = 10
"""Steps the throughput figures average over."""


class Throughput(BaseModel):
    steps_per_hour: float | None = None
    samples_per_second: float | None = None
    response_tokens_per_second: float | None = None


class Filtering(BaseModel):
    """Prompts left out of training, by reason (§6)."""

    dropped_online: int = 0
    """Solved in every sample during a previous stage (online filtering at stage starts)."""
    dropped_estimated_0: int = 0
    """Solved 0/N times by the difficulty estimation."""
    dropped_estimated_all: int = 0
    """Solved N/N times by the difficulty estimation."""
    estimation: dict | None = None
    """The difficulty estimation's progress (status, prompts, published, received, dropped_0, dropped_all)."""


class RunView(BaseModel):
    name: str
    status: RunStatus
    phase: Phase
    step: int
    """Steps completed (the barrier is at step `step`)."""
    total_steps: int
    """Steps of the plan if every stage runs all its steps (plateau rules may end stages earlier)."""
    stage: int | None = None
    stage_name: str | None = None
    context_length: int | None = None
    policy_version: int | None = None
    requested: list[str]
    """Pending requests to the driver (pause, stop)."""
    error: str | None = None
    workers: dict[str, dict[str, dict]]
    """Live processes of the run by service (rollout, reward, learner), from their heartbeats."""
    throughput: Throughput
    optimizer_resets: int = 0
    """Steps K at which the learner resumed without the optimizer state of policy version K (no
    intact checkpoint `step-<K>`: AdamW's moments started afresh); each step record says so (`optimizer_reset`)."""
    last_optimizer_reset_step: int | None = None
    last_metrics: dict | None = None
    stages: list[dict]
    """One record per started stage: start/end step, why it ended, prompts, filter counts."""
    filtering: Filtering
    validation: dict | None = None
    """The latest held-out validation: {"policy_version": v, "datasets": {dataset: figures}}
    (avg_at_n, pass_at_k with its CI, response_length_mean, truncated_ratio; `magic.evaluation`)."""
    best: dict | None = None
    """The best validation by `validation.best_by`: {"policy_version": v, "by": best_by, "value": x,
    "checkpoint": "step-<v>" (the learner is asked to write it and keep it whatever its age; None
    when the initial model is best), "checkpoint_written": whether it is complete on the data
    volume yet (it is written in the background at the step boundary after the validation)}."""
    spec: RunSpec


def filtering(c: Controller, run_id: str) -> Filtering:
    run = c.runs[run_id]
    reasons = [d["reason"] for d in run.dropped().values()]
    est = run.estimation()
    return Filtering(
        dropped_online=reasons.count("solved"),
        dropped_estimated_0=reasons.count("estimated_0"),
        dropped_estimated_all=reasons.count("estimated_all"),
        estimation=est,
    )


def latest_validation(c: Controller, run_id: str) -> dict | None:
    done = c.runs[run_id].validations()
    if not done:
        return None
    version = max(done)
    return {"policy_version": version, "datasets": done[version]}


def best_validation(c: Controller, run_id: str, spec: RunSpec) -> dict | None:
    top = best(spec.validation, c.runs[run_id].validations())
    if top is None:
        return None
    version, value = top
    name = checkpoint_name(version) if version > 0 else None
    written = name is not None and (checkpoint_root(c.runs[run_id].run_dir) / name / CHECKPOINT_MANIFEST).is_file()
    return {"policy_version": version, "by": spec.validation.best_by, "value": value, "checkpoint": name, "checkpoint_written": written}


def throughput(records: list[dict]) -> Throughput:
    """Over the recent `records`: from the first one's publication to the last one's record (its
    `time`), so steps that overlap (bounded staleness: publish to record spans the previous step's
    training too) count once; the sum of the steps' durations when a record has no time."""
    seconds = sum(r.get("step_seconds_total") or 0.0 for r in records)
    if records and all(isinstance(r.get("time"), (int, float)) for r in records):
        seconds = min(seconds, records[-1]["time"] - records[0]["time"] + (records[0].get("step_seconds_total") or 0.0))
    if not records or seconds <= 0:
        return Throughput()
    samples = sum(r.get("samples") or 0.0 for r in records)
    tokens = sum((r.get("samples") or 0.0) * (r.get("response_length_mean") or 0.0) for r in records)
    return Throughput(steps_per_hour=3600 * len(records) / seconds, samples_per_second=samples / seconds, response_tokens_per_second=tokens / seconds)


def run_view(c: Controller, run_id: str) -> RunView:
    spec = spec_or_404(c, run_id)
    run = c.runs[run_id]
    state = run.state()
    step = int(state.get("step", 0))
    index = int(state.get("stage", -1))
    stage = spec.stages[index] if 0 <= index < len(spec.stages) else None
    workers = {svc: run.alive(svc) for svc in ("rollout", "reward", "learner")}
    recent = run.metrics(since=max(0, step - THROUGHPUT_STEPS))
    return RunView(
        name=run_id,
        status=RunStatus(state.get("status", "pending")),
        phase=Phase(state.get("phase", Phase.publish.value)),
        step=step,
        total_steps=spec.total_steps,
        stage=index if stage else None,
        stage_name=stage.name if stage else None,
        context_length=stage.context_length if stage else None,
        policy_version=int(state["policy_version"]) if "policy_version" in state else None,
        requested=sorted(run.requested()),
        error=state.get("error"),
        workers=workers,
        throughput=throughput(recent),
        optimizer_resets=int(state.get("optimizer_resets", 0)),
        last_optimizer_reset_step=int(state["last_optimizer_reset_step"]) if "last_optimizer_reset_step" in state else None,
        last_metrics=recent[-1] if recent else None,
        stages=run.stage_records(),
        filtering=filtering(c, run_id),
        validation=latest_validation(c, run_id),
        best=best_validation(c, run_id, spec),
        spec=spec,
    )
