"""The controller's REST API (FastAPI; OpenAPI at /docs and /openapi.json), versioned under /v1.

    POST   /v1/datasets                  register a JSONL/Parquet dataset (validated; summary)
    GET    /v1/datasets[/{name}]         registered datasets
    DELETE /v1/datasets/{name}           forget a dataset
    POST   /v1/runs                      create a run (model, datasets, stage plan) and drive it
    GET    /v1/runs                      list runs
    GET    /v1/runs/{run}                status: stage, step, policy version, live workers, throughput, last metrics
    GET    /v1/runs/{run}/metrics        per-step records (?since=<step>)
    GET    /v1/runs/{run}/pass-rates     difficulty-estimation pass rates and dropped prompts
    POST   /v1/runs/{run}/stages         append the next stage (StageConfig)
    POST   /v1/runs/{run}/plan           append several stages; finish or wait after the last
    GET    /v1/runs/{run}/stages         the plan and what each started stage did
    POST   /v1/runs/{run}/pause|resume|stop
    POST   /v1/runs/{run}/evals          evaluate the current policy on registered datasets (202, an eval id)
    GET    /v1/runs/{run}/evals[/{id}]   evals: pending|running|done|failed, version, figures
    GET    /livez, /readyz, /metrics     probes and Prometheus (also alone on MAGIC_METRICS_PORT, when set)

Every POST/DELETE needs `Authorization: Bearer $MAGIC_API_TOKEN` when the controller has a
token (401 with WWW-Authenticate otherwise); GETs too with MAGIC_READ_REQUIRES_TOKEN=true (the
Helm chart's default). The probes and /metrics stay open. Malformed JSON is a 400, a body that
breaks the schema a 422 naming the field.

    magic serve controller      # or: python -m magic.controller
"""

from __future__ import annotations

import json
import logging
import signal
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from magic.controller.api import datasets, evals, runs, stages
from magic.controller.api import status as status_routes
from magic.controller.api.deps import Controller, ControllerDep
from magic.controller.api.guard import RequestGuard
from magic.controller.datasets import DatasetRegistry
from magic.controller.settings import ControllerSettings
from magic.observability.logs import setup_logging
from magic.observability.metrics import registry_of, serve_http
from magic.store.client import Redis, RedisError, answers, client
from magic.store.datasets import DatasetIndex
from magic.store.runs import Runs

log = logging.getLogger(__name__)


def create_app(settings: ControllerSettings | None = None, r: Redis | None = None) -> FastAPI:
    settings = settings or ControllerSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if settings.api_token is None:
            log.warning("MAGIC_API_TOKEN is not set: the controller's API accepts every request WITHOUT authentication (development only)")
        elif not settings.read_requires_token:
            log.info("GET routes are open (MAGIC_READ_REQUIRES_TOKEN=false): anyone who reaches the API sees run specs and dataset paths")
        conn = r or client(settings.redis_url, health_check_interval=30)
        controller = Controller(settings, Runs(conn, settings.data_dir, settings.heartbeat_ttl_seconds), DatasetRegistry(DatasetIndex(conn)))
        app.state.controller = controller
        controller.resume_active()
        # /metrics and the probes on a port of their own (MAGIC_METRICS_PORT): Prometheus and the
        # kubelet reach it while the API's port stays open only to the API's clients
        probes = serve_http(settings.metrics_port, lambda: answers(conn), registry=registry_of("controller"), stalled=controller.stalled) \
            if settings.metrics_port is not None else None
        yield
        if probes is not None:
            probes.shutdown()
        controller.shutdown()

    app = FastAPI(
        title="MAGIC controller",
        version="1.0.0",
        description="Runs multi-stage GRPO (Skywork-OR1's MAGIC recipe) over the rollout, reward and learner services.",
        lifespan=lifespan,
    )
    for router in (datasets.router, runs.router, stages.router, status_routes.router, evals.router):
        app.include_router(router)
    app.add_middleware(RequestGuard, token=settings.api_token, max_body_bytes=settings.max_body_bytes, read_requires_token=settings.read_requires_token)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return JSONResponse({"detail": [{"type": "json_invalid", "loc": ["body"], "msg": "the request body is not valid JSON"}]}, status.HTTP_400_BAD_REQUEST)
        return JSONResponse({"detail": [_echo_safe(e) for e in errors]}, 422)

    @app.exception_handler(RedisError)
    async def redis_error(request: Request, exc: RedisError) -> JSONResponse:
        log.error("redis error on %s %s: %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": f"Redis is unavailable: {exc}"}, status.HTTP_503_SERVICE_UNAVAILABLE)

    @app.get("/livez", response_class=PlainTextResponse, include_in_schema=False)
    def livez(c: ControllerDep) -> Response:
        why = c.stalled()
        return PlainTextResponse("ok") if why is None else PlainTextResponse(f"hung: {why}", status_code=503)

    @app.get("/readyz", response_class=PlainTextResponse, include_in_schema=False)
    def readyz(c: ControllerDep) -> Response:
        try:
            c.runs.ping()
        except RedisError as exc:
            return PlainTextResponse(f"redis unreachable: {exc}", status_code=503)
        return PlainTextResponse("ready")

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry_of("controller")), media_type=CONTENT_TYPE_LATEST)

    return app


def _echo_safe(error: dict) -> dict:
    """A validation error as JSON, its `input` cut to a short repr (never the whole body back,
    never a NaN that JSON cannot carry)."""
    out = {k: v for k, v in error.items() if k not in ("input", "ctx", "url")}
    if "input" in error:
        try:
            value = jsonable_encoder(error["input"])
            small = len(json.dumps(value, allow_nan=False)) <= 200
        except (TypeError, ValueError):
            small = False
        text = repr(error["input"])
        out["input"] = value if small else text[:200] + ("…" if len(text) > 200 else "")
    if "ctx" in error:
        out["ctx"] = {k: str(v)[:200] for k, v in error["ctx"].items()}
    return jsonable_encoder(out)


def run(settings: ControllerSettings | None = None) -> int:
    settings = settings or ControllerSettings()
    setup_logging("controller", settings.worker_name, settings.log_level)
    # uvicorn shuts down gracefully on SIGTERM/SIGINT and then re-raises the signal with the
    # handlers it found installed: with Python's defaults the process would die with 143 after a
    # clean shutdown. A no-op handler makes a requested stop exit 0, as it should.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level.lower(), access_log=False)
    return 0


__all__ = ["Controller", "create_app", "run"]
