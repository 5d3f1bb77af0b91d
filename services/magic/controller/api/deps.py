"""What every router shares: the controller object, the bearer-token check, error helpers."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from magic.config.schema import RunSpec
from magic.controller.api.guard import token_problem
from magic.controller.datasets import DatasetRegistry
from magic.controller.driver import StepDriver
from magic.controller.settings import ControllerSettings
from magic.protocol.status import TERMINAL, RunStatus
from magic.store.lease import RedisLostData, RunEnded
from magic.store.runs import Runs

log = logging.getLogger(__name__)


class Controller:
    """Owns the runs' state, the dataset registry and one step driver per active run."""

    def __init__(self, settings: ControllerSettings, runs: Runs, datasets: DatasetRegistry):
        self.settings = settings
        self.runs = runs
        self.datasets = datasets
        self.drivers: dict[str, StepDriver] = {}
        self.lock = threading.Lock()  # serialises run creation and driver starts

    def start_driver(self, run_id: str) -> None:
        driver = self.drivers.get(run_id)
        if driver is None or not driver.is_alive():
            driver = StepDriver(self.runs, self.datasets, run_id, self.settings)
            self.drivers[run_id] = driver
            driver.start()

    def poke(self, run_id: str) -> None:
        """Wake the run's driver so it reacts to a request at once."""
        driver = self.drivers.get(run_id)
        if driver is not None:
            driver.wake.set()

    def resume_active(self) -> None:
        """After a restart: keep driving the active run where its persisted state says; drive the
        runs Redis lost too, so that they fail at once saying so."""
        run_id = self.runs.active()
        if run_id and (run := self.runs[run_id]).status() not in TERMINAL and run.spec() is not None:
            log.info("resuming run %s", run_id)
            self.start_driver(run_id)
        for lost in self.runs.lost():
            log.error("run %s: Redis lost its state; failing it", lost)
            self.start_driver(lost)

    def end_unattended(self, run_id: str, status: RunStatus) -> bool:
        """End run `run_id` when no controller drives it (its driver died, or none ever started
        here): take its lease for one fenced write. False when another controller drives it (that
        one ends it on the request it reads)."""
        lease = self.runs.lease(run_id, f"{self.settings.worker_name}-api-{uuid.uuid4().hex[:8]}", self.settings.lease_seconds)
        try:
            if not lease.try_acquire():
                return False
            self.runs.store(run_id, writer=lease).finish(status)
            return True
        except (RunEnded, RedisLostData):
            return False
        finally:
            lease.release()

    def stalled(self) -> str | None:
        """Why a run's driver is hung (its loop has not come round for `liveness_stall_seconds`),
        or None: the controller's /livez."""
        for run_id, d in list(self.drivers.items()):
            if d.is_alive() and (why := d.watch.stalled()) is not None:
                return f"run {run_id}: {why}"
        return None

    def shutdown(self) -> None:
        for d in self.drivers.values():
            d.shutdown.set()
            d.wake.set()
        for d in self.drivers.values():
            d.join(timeout=5)


def get_controller(request: Request) -> Controller:
    return request.app.state.controller


ControllerDep = Annotated[Controller, Depends(get_controller)]

_bearer = HTTPBearer(auto_error=False, description="MAGIC_API_TOKEN of the controller")


def require_token(
    c: ControllerDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Every mutating endpoint: `Authorization: Bearer <MAGIC_API_TOKEN>` (no check when the
    controller runs without a token, which it warns about at start)."""
    problem = token_problem(f"Bearer {credentials.credentials}" if credentials else None, c.settings.api_token)
    if problem is not None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, problem[0], headers={"WWW-Authenticate": problem[1]})


Authorized = [Depends(require_token)]
"""`dependencies=` of every mutating route."""


def not_found(what: str, name: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, f"no {what} named {name!r}")


def invalid(loc: list[str | int], msg: str, input: object = None) -> HTTPException:
    """A 422 in FastAPI's own shape, naming the field (`loc`) and why (`msg`)."""
    return HTTPException(422, [{"type": "value_error", "loc": ["body", *loc], "msg": msg, "input": input}])


def spec_or_404(c: Controller, run_id: str) -> RunSpec:
    spec = c.runs[run_id].spec()
    if spec is None:
        raise not_found("run", run_id)
    return spec
