"""The controller's REST API (FastAPI; OpenAPI at /docs), versioned under /v1.

    POST /v1/runs                    create a run (RunSpec) and start driving it
    GET  /v1/runs                    list runs
    GET  /v1/runs/{run}              status: stage, step, policy version, live workers, last metrics
    GET  /v1/runs/{run}/metrics      per-step records (?since=<step>)
    POST /v1/runs/{run}/stages       append a stage (StageConfig) to the run's plan
    POST /v1/runs/{run}/stop         stop the run after the current step
    GET  /livez, /readyz, /metrics   probes and Prometheus
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import Annotated

import redis
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from pydantic import BaseModel

from magic.common.config import ControllerSettings, RunSpec, StageConfig
from magic.common.heartbeat import alive_workers
from magic.controller.datasets import DatasetError, load_jsonl
from magic.controller.driver import StepDriver
from magic.controller.store import TERMINAL, RunBusy, RunExists, RunStatus, RunStore

log = logging.getLogger(__name__)


class Controller:
    """Owns the Redis connection, the run store and one step driver per active run."""

    def __init__(self, settings: ControllerSettings, r: redis.Redis):
        self.settings = settings
        self.r = r
        self.store = RunStore(r, settings.data_dir)
        self.drivers: dict[str, StepDriver] = {}

    def start_driver(self, run_id: str) -> None:
        driver = self.drivers.get(run_id)
        if driver is None or not driver.is_alive():
            driver = StepDriver(self.r, run_id, self.settings, self.store)
            self.drivers[run_id] = driver
            driver.start()

    def resume_active(self) -> None:
        """After a restart: keep driving the active run where its persisted state says."""
        run_id = self.store.active()
        if run_id and self.store.status(run_id) not in TERMINAL:
            log.info("resuming run %s", run_id)
            self.start_driver(run_id)

    def shutdown(self) -> None:
        for d in self.drivers.values():
            d.stop_requested.set()
        for d in self.drivers.values():
            d.join(timeout=5)


def get_controller(request: Request) -> Controller:
    return request.app.state.controller


ControllerDep = Annotated[Controller, Depends(get_controller)]


class RunView(BaseModel):
    name: str
    status: RunStatus
    step: int
    total_steps: int
    stage: int | None = None
    stage_name: str | None = None
    context_length: int | None = None
    policy_version: int | None = None
    error: str | None = None
    workers: dict[str, dict[str, dict]]
    last_metrics: dict | None = None
    spec: RunSpec


def _run_view(c: Controller, run_id: str) -> RunView:
    spec = c.store.spec(run_id)
    if spec is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run named {run_id!r}")
    state = c.store.state(run_id)
    step = int(state.get("step", 0))
    stage_index, stage = spec.stage_at(min(step, spec.total_steps - 1))
    workers = {
        svc: {n: s for n, s in alive_workers(c.r, svc).items() if s.get("run") == run_id} for svc in ("rollout", "reward", "learner")
    }
    return RunView(
        name=run_id,
        status=RunStatus(state.get("status", "pending")),
        step=step,
        total_steps=spec.total_steps,
        stage=stage_index,
        stage_name=stage.name,
        context_length=stage.context_length,
        policy_version=int(state["policy_version"]) if "policy_version" in state else None,
        error=state.get("error"),
        workers=workers,
        last_metrics=c.store.last_metrics(run_id),
        spec=spec,
    )


runs = APIRouter(prefix="/v1/runs", tags=["runs"])


@runs.post("", status_code=status.HTTP_201_CREATED, response_model=RunView)
def create_run(spec: RunSpec, c: ControllerDep) -> RunView:
    for path in spec.train_files:
        try:
            load_jsonl(path)
        except DatasetError as exc:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY, f"train_files: {exc}") from None
    try:
        c.store.create(spec)
    except RunExists:
        raise HTTPException(status.HTTP_409_CONFLICT, f"a run named {spec.name!r} already exists") from None
    except RunBusy as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, f"run {exc.args[0]!r} is active; stop it first") from None
    c.start_driver(spec.name)
    return _run_view(c, spec.name)


@runs.get("", response_model=list[str])
def list_runs(c: ControllerDep) -> list[str]:
    return c.store.list()


@runs.get("/{run_id}", response_model=RunView)
def get_run(run_id: str, c: ControllerDep) -> RunView:
    return _run_view(c, run_id)


@runs.get("/{run_id}/metrics")
def get_metrics(run_id: str, c: ControllerDep, since: Annotated[int, Query(ge=0)] = 0) -> list[dict]:
    if c.store.spec(run_id) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run named {run_id!r}")
    return c.store.metrics(run_id, since)


@runs.post("/{run_id}/stages", response_model=RunView)
def append_stage(run_id: str, stage: StageConfig, c: ControllerDep) -> RunView:
    spec = c.store.spec(run_id)
    if spec is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run named {run_id!r}")
    if c.store.status(run_id) in TERMINAL:
        raise HTTPException(status.HTTP_409_CONFLICT, f"run {run_id!r} has ended")
    if stage.name in {s.name for s in spec.stages}:
        raise HTTPException(status.HTTP_409_CONFLICT, f"run {run_id!r} already has a stage named {stage.name!r}")
    c.store.append_stage(run_id, stage)
    return _run_view(c, run_id)


@runs.post("/{run_id}/stop", response_model=RunView)
def stop_run(run_id: str, c: ControllerDep) -> RunView:
    if c.store.spec(run_id) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run named {run_id!r}")
    driver = c.drivers.get(run_id)
    if driver is not None and driver.is_alive():
        driver.stop_requested.set()
        driver.join(timeout=30)
    if c.store.status(run_id) not in TERMINAL:
        c.store.finish(run_id, RunStatus.stopped)
    return _run_view(c, run_id)


def create_app(settings: ControllerSettings | None = None, r: redis.Redis | None = None) -> FastAPI:
    settings = settings or ControllerSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        conn = r or redis.Redis.from_url(settings.redis_url, health_check_interval=30)
        controller = Controller(settings, conn)
        app.state.controller = controller
        controller.resume_active()
        yield
        controller.shutdown()

    app = FastAPI(title="MAGIC controller", version="0.1.0", lifespan=lifespan)
    app.include_router(runs)

    @app.get("/livez", response_class=PlainTextResponse, include_in_schema=False)
    def livez() -> str:
        return "ok"

    @app.get("/readyz", response_class=PlainTextResponse, include_in_schema=False)
    def readyz(c: ControllerDep) -> Response:
        try:
            c.r.ping()
        except redis.RedisError as exc:
            return PlainTextResponse(f"redis unreachable: {exc}", status_code=503)
        return PlainTextResponse("ready")

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return app


def run(settings: ControllerSettings | None = None) -> int:
    import uvicorn

    from magic.common.logs import setup_logging

    settings = settings or ControllerSettings()
    setup_logging("controller", settings.worker_name, settings.log_level)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level.lower(), access_log=False)
    return 0
