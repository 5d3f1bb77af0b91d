"""Runs: create (model, datasets, stage plan), list, pause, resume, stop.

    POST /v1/runs                 create a run and start driving it
    GET  /v1/runs                 list runs (name, status, step)
    POST /v1/runs/{run}/pause     publish no new step after the current one
    POST /v1/runs/{run}/resume    go on after a pause
    POST /v1/runs/{run}/stop      end the run now (status `stopped`; workers detach)
"""

from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException, status
from pydantic import BaseModel

from magic.config.schema import DatasetSpec, RunSpec
from magic.controller.api.checks import check_held_out, check_stage, dataset_name_for, model_limits
from magic.controller.api.deps import Authorized, Controller, ControllerDep, invalid, spec_or_404
from magic.controller.api.views import RunView, run_view
from magic.controller.datasets import DatasetError
from magic.protocol.status import TERMINAL, RunStatus
from magic.store.runs import KeySquatted, RunBusy, RunExists

router = APIRouter(prefix="/v1/runs", tags=["runs"])

CONFLICTS = {409: {"description": "a run of that name exists, another run is active, or the run has ended"}}


class RunSummary(BaseModel):
    name: str
    status: RunStatus
    step: int
    stage: int | None = None
    created_at: float | None = None


def _resolve_datasets(c: Controller, spec: RunSpec) -> tuple[RunSpec, list]:
    """Registered names stay; file paths are registered under their stem. Returns the spec
    naming registered datasets only, and the records."""
    names, records = [], []
    for i, item in enumerate(spec.datasets):
        if "/" in item or item.endswith((".jsonl", ".json", ".parquet")):
            try:
                info, _ = c.datasets.register(DatasetSpec(name=dataset_name_for(item), path=item))
            except DatasetError as exc:
                raise HTTPException(status.HTTP_400_BAD_REQUEST, f"datasets[{i}]: {exc}") from None
            except FileExistsError:
                raise invalid(["datasets", i], f"another file is registered as {dataset_name_for(item)!r}; register {item} under another name first", item) from None
            name = info.name
        else:
            if c.datasets.get(item) is None:
                raise invalid(["datasets", i], f"no dataset registered as {item!r} (POST /v1/datasets first, or give a file path)", item)
            name = item
        try:
            records += c.datasets.load(name)
        except DatasetError as exc:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, f"datasets[{i}]: {exc}") from None
        names.append(name)
    return spec.model_copy(update={"datasets": names}), records


def _check_validation(c: Controller, spec: RunSpec, window: int | None) -> None:
    """422 naming the field when the validation block cannot be evaluated (`check_held_out`)."""
    if spec.validation is not None:
        check_held_out(c, spec.model, spec.validation, ["validation"], max((s.context_length for s in spec.stages), default=0), window)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=RunView, dependencies=Authorized, responses={400: {"description": "a dataset file is missing or malformed"}, **CONFLICTS})
def create_run(spec: RunSpec, c: ControllerDep) -> RunView:
    """Create a run and start it: the whole `stages` plan advances by itself; with no stages the
    run waits for POST /v1/runs/{run}/stages."""
    if c.runs[spec.name].spec() is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"a run named {spec.name!r} already exists")
    spec, records = _resolve_datasets(c, spec)
    window, prompt_tokens = model_limits(spec.model, records)
    for i, stage in enumerate(spec.stages):
        check_stage(stage, ["stages", i], window, prompt_tokens)
    if spec.estimation is not None and window is not None and prompt_tokens + spec.estimation.context_length > window:
        raise invalid(["estimation", "context_length"], f"T = {spec.estimation.context_length} plus the longest prompt ({prompt_tokens} tokens) exceeds the model's context window {window}")
    _check_validation(c, spec, window)
    with c.lock:
        try:
            c.runs.create(spec, {"max_prompt_tokens": prompt_tokens, "model_context_window": window or 0})
        except RunExists:
            raise HTTPException(status.HTTP_409_CONFLICT, f"a run named {spec.name!r} already exists") from None
        except RunBusy as exc:
            raise HTTPException(status.HTTP_409_CONFLICT, f"run {exc.args[0]!r} is active; stop it first") from None
        except KeySquatted as exc:
            raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
        c.start_driver(spec.name)
    return run_view(c, spec.name)


@router.get("", response_model=list[RunSummary])
def list_runs(c: ControllerDep) -> list[RunSummary]:
    out = []
    for name in c.runs.list():
        state = c.runs[name].state()
        if not state:
            continue
        stage = int(state.get("stage", -1))
        out.append(RunSummary(name=name, status=RunStatus(state.get("status", "pending")), step=int(state.get("step", 0)), stage=stage if stage >= 0 else None, created_at=float(state.get("created_at", 0)) or None))
    return out


def _live(c: Controller, run_id: str) -> RunStatus:
    spec_or_404(c, run_id)
    current = c.runs[run_id].status()
    if current in TERMINAL:
        raise HTTPException(status.HTTP_409_CONFLICT, f"run {run_id!r} has ended ({current.value})")
    return current


@router.post("/{run_id}/pause", response_model=RunView, dependencies=Authorized, responses=CONFLICTS)
def pause_run(run_id: str, c: ControllerDep) -> RunView:
    """No new step is published after the current one completes (status `paused`)."""
    _live(c, run_id)
    c.runs[run_id].request("pause")
    c.poke(run_id)
    return run_view(c, run_id)


@router.post("/{run_id}/resume", response_model=RunView, dependencies=Authorized, responses=CONFLICTS)
def resume_run(run_id: str, c: ControllerDep) -> RunView:
    _live(c, run_id)
    if "pause" not in c.runs[run_id].requested():
        raise HTTPException(status.HTTP_409_CONFLICT, f"run {run_id!r} is not paused")
    c.runs[run_id].request("resume")
    c.poke(run_id)
    deadline = time.monotonic() + 2.0
    while c.runs[run_id].status() is RunStatus.paused and time.monotonic() < deadline:
        time.sleep(0.05)
    return run_view(c, run_id)


@router.post("/{run_id}/stop", response_model=RunView, dependencies=Authorized, responses=CONFLICTS)
def stop_run(run_id: str, c: ControllerDep) -> RunView:
    """End the run now: the step in flight is abandoned, workers detach, status `stopped`."""
    _live(c, run_id)
    c.runs[run_id].request("stop")
    driver = c.drivers.get(run_id)
    if driver is not None and driver.is_alive():
        driver.wake.set()
        driver.join(timeout=10)
    deadline = time.monotonic() + 10.0
    while c.runs[run_id].status() not in TERMINAL and not c.end_unattended(run_id, RunStatus.stopped) and time.monotonic() < deadline:
        time.sleep(0.1)  # another controller drives the run: it ends it on the request
    return run_view(c, run_id)
