"""Requested held-out evaluations of a run's current policy (`magic eval --run`).

    POST /v1/runs/{run}/evals        evaluate the policy version the rollout workers serve at the
                                     next step boundary (at once while the run is paused or waits
                                     for a stage); body: EvalConfig (the validation block less
                                     `every`) -> 202 with the eval's id
    GET  /v1/runs/{run}/evals        every eval of the run
    GET  /v1/runs/{run}/evals/{id}   status pending|running|done|failed, the policy version
                                     evaluated, T, the figures per dataset (or why it failed)

The run's driver serves them through the rollout and reward services, as the run's validation
(`magic.controller.validation`): the learner never sees them. A run that has ended, or that no
controller drives, cannot evaluate (409): evaluate its checkpoint with `magic eval --local`.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status
from pydantic import BaseModel

from magic.config.schema import EvalConfig
from magic.controller.api.checks import check_held_out
from magic.controller.api.deps import Authorized, Controller, ControllerDep, invalid, not_found, spec_or_404
from magic.controller.validation import EVAL_OPEN
from magic.protocol.status import TERMINAL

router = APIRouter(prefix="/v1/runs/{run_id}/evals", tags=["evals"])

ENDED_ADVICE = (
    "evaluate a checkpoint on this machine with `magic eval --local DATA_DIR/runs/{run}/checkpoints/step-K -d DATA.jsonl`, "
    "or `magic export {run}` it and create a run with that model and no stages (it waits), then `magic eval --run` that run"
)


class EvalView(BaseModel):
    id: str
    status: str
    """pending (queued for the next step boundary), running, done or failed."""
    config: EvalConfig
    policy_version: int | None = None
    """The policy version evaluated (set when it starts)."""
    context_length: int | None = None
    """T of the samples (the request's, else the current stage's)."""
    figures: dict[str, dict] | None = None
    """{dataset: figures}: avg_at_n, pass_at_k with its 95% CI, response_length_mean, truncated_ratio, seconds (`magic.evaluation`)."""
    error: str | None = None
    created_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None


def _view(c: Controller, run_id: str, record: dict) -> EvalView:
    """An eval's record; one left open by a run that has ended reads as failed, saying so."""
    current = c.runs[run_id].status()
    if record["status"] in EVAL_OPEN and current in TERMINAL:
        record = {**record, "status": "failed", "error": f"run {run_id!r} ended ({current.value}) before the eval was served"}
    return EvalView.model_validate(record)


def _driven(c: Controller, run_id: str) -> bool:
    """Whether a driver serves run `run_id`: this controller's, or another's holding its lease."""
    driver = c.drivers.get(run_id)
    if driver is not None and driver.is_alive():
        return True
    return c.runs.lease(run_id, "api-probe", c.settings.lease_seconds).holder_now() is not None


@router.post(
    "", status_code=status.HTTP_202_ACCEPTED, response_model=EvalView, dependencies=Authorized,
    responses={409: {"description": "the run has ended or no controller drives it"}},
)
def create_eval(run_id: str, cfg: EvalConfig, c: ControllerDep) -> EvalView:
    """Queue an evaluation of the run's current policy on registered datasets; poll GET .../evals/{id}."""
    spec = spec_or_404(c, run_id)
    current = c.runs[run_id].status()
    if current in TERMINAL:
        raise HTTPException(status.HTTP_409_CONFLICT, f"run {run_id!r} has ended ({current.value}): no rollout workers serve its policy; " + ENDED_ADVICE.format(run=run_id))
    if not _driven(c, run_id):
        raise HTTPException(status.HTTP_409_CONFLICT, f"no controller drives run {run_id!r} (status {current.value if current else 'unknown'}): nothing would serve the eval; " + ENDED_ADVICE.format(run=run_id))
    state = c.runs[run_id].state()
    window = int(state.get("model_context_window", 0)) or None
    stage_t = max((s.context_length for s in spec.stages), default=0)
    if cfg.context_length is None and not stage_t:
        raise invalid(["context_length"], "the run has no stage yet to take T from: give context_length (T)")
    check_held_out(c, spec.model, cfg, [], stage_t, window)
    record = c.runs[run_id].create_eval(cfg.model_dump(mode="json"))
    c.poke(run_id)
    return _view(c, run_id, record)


@router.get("", response_model=list[EvalView])
def list_evals(run_id: str, c: ControllerDep) -> list[EvalView]:
    spec_or_404(c, run_id)
    return [_view(c, run_id, e) for e in c.runs[run_id].evals()]


@router.get("/{eval_id}", response_model=EvalView)
def get_eval(run_id: str, eval_id: str, c: ControllerDep) -> EvalView:
    spec_or_404(c, run_id)
    record = c.runs[run_id].eval(eval_id)
    if record is None:
        raise not_found(f"eval of run {run_id!r}", eval_id)
    return _view(c, run_id, record)
