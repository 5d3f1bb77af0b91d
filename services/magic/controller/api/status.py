"""Status: what a run is doing, its per-step records and its filtered prompts.

    GET /v1/runs/{run}                 status: stage, step, policy version, live workers, throughput, last metrics
    GET /v1/runs/{run}/metrics         per-step records (?since=<step>&limit=<n>)
    GET /v1/runs/{run}/pass-rates      per-prompt pass rates of the difficulty estimation, and dropped prompts
    GET /v1/runs/{run}/validation      held-out figures per validated policy version and dataset
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel

from magic.controller.api.deps import ControllerDep, spec_or_404
from magic.controller.api.views import Filtering, RunView, filtering, run_view

router = APIRouter(prefix="/v1/runs/{run_id}", tags=["status"])


@router.get("", response_model=RunView)
def get_run(run_id: str, c: ControllerDep) -> RunView:
    return run_view(c, run_id)


@router.get("/metrics")
def get_metrics(
    run_id: str,
    c: ControllerDep,
    since: Annotated[int, Query(ge=0, le=2**40)] = 0,
    limit: Annotated[int | None, Query(ge=1, le=100_000)] = None,
) -> list[dict]:
    spec_or_404(c, run_id)
    return c.runs[run_id].metrics(since, limit)


class PassRates(BaseModel):
    filtering: Filtering
    pass_rates: dict[str, str]
    """prompt uid -> "correct/N" from the difficulty estimation."""
    dropped: dict[str, dict]
    """prompt uid -> {from_stage, reason}."""


@router.get("/pass-rates", response_model=PassRates)
def get_pass_rates(run_id: str, c: ControllerDep) -> PassRates:
    spec_or_404(c, run_id)
    return PassRates(filtering=filtering(c, run_id), pass_rates=c.runs[run_id].pass_rates(), dropped=c.runs[run_id].dropped())


@router.get("/validation")
def get_validation(run_id: str, c: ControllerDep) -> dict[str, dict[str, dict]]:
    """Policy version -> {dataset: figures} of every finished held-out validation (the final
    policy's included, which no step record carries)."""
    spec_or_404(c, run_id)
    return {str(v): f for v, f in c.runs[run_id].validations().items()}
