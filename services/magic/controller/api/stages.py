"""Stages: start the next stage with its config, or submit a plan that advances by itself.

    POST /v1/runs/{run}/stages    append one stage (it starts when the current one ends, or now
                                  if the run is waiting for a stage)
    POST /v1/runs/{run}/plan      append several stages and say what happens after the last one
    GET  /v1/runs/{run}/stages    the plan and what each started stage did
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status
from pydantic import BaseModel, ConfigDict, Field, model_validator

from magic.config.schema import PlanEnd, StageConfig, duplicate_stage_name, require_unique_stage_names
from magic.controller.api.checks import check_stage
from magic.controller.api.deps import Authorized, Controller, ControllerDep, spec_or_404
from magic.controller.api.views import RunView, run_view
from magic.protocol.status import TERMINAL
from magic.store.runs import RunExists

router = APIRouter(prefix="/v1/runs/{run_id}", tags=["stages"])


class PlanRequest(BaseModel):
    """Stages to append, run in order, and what the run does after the last one."""

    model_config = ConfigDict(extra="forbid")

    stages: list[StageConfig] = Field(min_length=1, max_length=1000)
    on_plan_end: PlanEnd = "finish"
    """"finish" the run after the last stage, or "wait" for more."""

    @model_validator(mode="after")
    def _unique(self) -> "PlanRequest":
        require_unique_stage_names([s.name for s in self.stages])
        return self


class StagesView(BaseModel):
    plan: list[StageConfig]
    started: list[dict]
    """One record per started stage: start/end step, why it ended, prompts, filter counts."""


def _append(c: Controller, run_id: str, stages: list[StageConfig], loc: list[str | int], on_plan_end: str | None = None) -> None:
    spec = spec_or_404(c, run_id)
    current = c.runs[run_id].status()
    if current in TERMINAL:
        raise HTTPException(status.HTTP_409_CONFLICT, f"run {run_id!r} has ended ({current.value}); create a new run")
    if (dup := duplicate_stage_name([s.name for s in stages], {s.name for s in spec.stages})) is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"run {run_id!r} already has a stage named {dup!r}")
    state = c.runs[run_id].state()
    window = int(state.get("model_context_window", 0)) or None
    for i, stage in enumerate(stages):
        check_stage(stage, [*loc, i] if len(loc) else [], window, int(state.get("max_prompt_tokens", 0)))
    try:
        c.runs[run_id].append_stages(stages, on_plan_end)
    except RunExists as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, f"run {run_id!r} already has a stage named {str(exc)!r}") from None


@router.post("/stages", status_code=status.HTTP_201_CREATED, response_model=RunView, dependencies=Authorized, responses={409: {"description": "the run has ended or has a stage of that name"}})
def start_stage(run_id: str, stage: StageConfig, c: ControllerDep) -> RunView:
    """Append a stage: it starts when the current stage ends (at once if the run waits for one)."""
    _append(c, run_id, [stage], [])
    c.poke(run_id)
    return run_view(c, run_id)


@router.post("/plan", status_code=status.HTTP_201_CREATED, response_model=RunView, dependencies=Authorized, responses={409: {"description": "the run has ended or has a stage of that name"}})
def submit_plan(run_id: str, plan: PlanRequest, c: ControllerDep) -> RunView:
    """Append a whole plan; the run advances through it by itself, then finishes or waits."""
    _append(c, run_id, plan.stages, ["stages"], plan.on_plan_end)
    c.poke(run_id)
    return run_view(c, run_id)


@router.get("/stages", response_model=StagesView)
def list_stages(run_id: str, c: ControllerDep) -> StagesView:
    spec = spec_or_404(c, run_id)
    return StagesView(plan=spec.stages, started=c.runs[run_id].stage_records())
