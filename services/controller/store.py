"""Run state in Redis: the spec, the status and progress, and the per-step metric records.

Everything the controller knows lives here, so a restarted controller picks up where it stopped.
"""

from __future__ import annotations

import json
import time
from enum import Enum
from pathlib import Path

import redis

from magic.common import keys
from magic.common.config import RunSpec, StageConfig


class RunStatus(str, Enum):
    pending = "pending"  # created, waiting for workers
    running = "running"
    finished = "finished"
    failed = "failed"
    stopped = "stopped"


TERMINAL = {RunStatus.finished, RunStatus.failed, RunStatus.stopped}


class Phase(str, Enum):
    """Where the on-policy step barrier is within step `step` (persisted for restarts)."""

    publish = "publish"  # waiting for rollout workers at version k, then publishing prompts
    rollout = "rollout"  # prompts out; waiting for the learner's StepCompleted(k)
    sync = "sync"  # learner published k+1; waiting for rollout workers to load it


class RunExists(Exception):
    pass


class RunBusy(Exception):
    pass


class RunStore:
    def __init__(self, r: redis.Redis, data_dir: Path):
        self.r = r
        self.data_dir = Path(data_dir)

    def run_dir(self, run_id: str) -> Path:
        return self.data_dir / "runs" / run_id

    # -- runs --------------------------------------------------------------------------------

    def create(self, spec: RunSpec) -> None:
        """Store a new run and make it the active one; raise RunExists / RunBusy."""
        k = keys.RunKeys(spec.name)
        active = self.active()
        if active is not None and active != spec.name:
            raise RunBusy(active)
        if not self.r.set(k.spec, spec.model_dump_json(), nx=True):
            raise RunExists(spec.name)
        now = time.time()
        self.r.hset(k.state, mapping={"status": RunStatus.pending.value, "step": 0, "phase": Phase.publish.value, "created_at": now})
        self.r.zadd(keys.RUN_INDEX, {spec.name: now})
        self.r.set(keys.ACTIVE_RUN, spec.name)
        self.run_dir(spec.name).mkdir(parents=True, exist_ok=True)

    def spec(self, run_id: str) -> RunSpec | None:
        raw = self.r.get(keys.RunKeys(run_id).spec)
        return RunSpec.model_validate_json(raw) if raw else None

    def append_stage(self, run_id: str, stage: StageConfig) -> RunSpec:
        spec = self.spec(run_id)
        assert spec is not None
        updated = RunSpec.model_validate({**spec.model_dump(), "stages": [*spec.model_dump()["stages"], stage.model_dump()]})
        self.r.set(keys.RunKeys(run_id).spec, updated.model_dump_json())
        return updated

    def state(self, run_id: str) -> dict[str, str]:
        raw = self.r.hgetall(keys.RunKeys(run_id).state)
        return {k.decode(): v.decode() for k, v in raw.items()}

    def update(self, run_id: str, **fields) -> None:
        self.r.hset(keys.RunKeys(run_id).state, mapping={k: (v.value if isinstance(v, Enum) else v) for k, v in fields.items()})

    def status(self, run_id: str) -> RunStatus | None:
        raw = self.r.hget(keys.RunKeys(run_id).state, "status")
        return RunStatus(raw.decode()) if raw else None

    def finish(self, run_id: str, status: RunStatus, error: str | None = None) -> None:
        fields = {"status": status, "finished_at": time.time()}
        if error:
            fields["error"] = error[:4000]
        self.update(run_id, **fields)
        if self.active() == run_id:
            self.r.delete(keys.ACTIVE_RUN)

    def active(self) -> str | None:
        raw = self.r.get(keys.ACTIVE_RUN)
        return raw.decode() if raw else None

    def list(self) -> list[str]:
        return [x.decode() for x in self.r.zrange(keys.RUN_INDEX, 0, -1)]

    # -- metrics -----------------------------------------------------------------------------

    def append_metrics(self, run_id: str, record: dict) -> bool:
        """Keep the step record in Redis and append it to the run's JSONL log — once per step
        (a controller restarted between writing and moving on does not write it twice)."""
        last = self.last_metrics(run_id)
        if last is not None and last["step"] >= record["step"]:
            return False
        line = json.dumps(record, sort_keys=True)
        self.r.rpush(keys.RunKeys(run_id).metrics, line)
        path = self.run_dir(run_id) / "metrics.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(line + "\n")
        return True

    def metrics(self, run_id: str, since: int = 0) -> list[dict]:
        """Step records with step >= since."""
        rows = [json.loads(x) for x in self.r.lrange(keys.RunKeys(run_id).metrics, 0, -1)]
        return [row for row in rows if row.get("step", 0) >= since]

    def last_metrics(self, run_id: str) -> dict | None:
        raw = self.r.lindex(keys.RunKeys(run_id).metrics, -1)
        return json.loads(raw) if raw else None
