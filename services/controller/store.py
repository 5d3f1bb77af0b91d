"""Run state in Redis: the spec, the status and barrier position, stage records, per-step metrics.

Everything the controller knows lives here, so a restarted controller picks up where it stopped.
The barrier position is the state hash's `step` (k) and `phase`; the driver moves it forward
only inside the same MULTI/EXEC transaction that does the phase's side effect (publishing the
prompts, recording the step), so a crash leaves either both or neither.
"""

from __future__ import annotations

import json
import math
import time
from enum import Enum
from pathlib import Path

import redis

from magic.common import keys
from magic.common.config import RunSpec, StageConfig


class RunStatus(str, Enum):
    pending = "pending"  # created, not driven yet
    estimating = "estimating"  # offline difficulty estimation before the first step
    running = "running"
    paused = "paused"  # no new step is published until resumed
    waiting = "waiting"  # the plan is done; waiting for the next stage
    finished = "finished"
    failed = "failed"
    stopped = "stopped"


TERMINAL = {RunStatus.finished, RunStatus.failed, RunStatus.stopped}


class Phase(str, Enum):
    """Where the on-policy step barrier is within step `step` (persisted for restarts)."""

    estimate = "estimate"  # offline difficulty estimation (before step 0)
    publish = "publish"  # waiting for rollout workers at version k, then publishing prompts
    rollout = "rollout"  # prompts out; waiting for the learner's StepCompleted(k)
    sync = "sync"  # learner published k+1; waiting for rollout workers to load it


class RunExists(Exception):
    pass


class RunBusy(Exception):
    pass


def finite(record: dict) -> dict:
    """The record with NaN/inf floats replaced by None (JSON has no NaN; the API must not 500)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}


class RunStore:
    def __init__(self, r: redis.Redis, data_dir: Path):
        self.r = r
        self.data_dir = Path(data_dir)

    def run_dir(self, run_id: str) -> Path:
        return self.data_dir / "runs" / run_id

    # -- runs --------------------------------------------------------------------------------

    def create(self, spec: RunSpec, extra_state: dict | None = None) -> None:
        """Store a new run and make it the active one; raise RunExists / RunBusy."""
        k = keys.RunKeys(spec.name)
        if self.r.exists(k.spec):
            raise RunExists(spec.name)
        active = self.active()
        if active is not None and active != spec.name:
            raise RunBusy(active)
        if not self.r.set(k.spec, spec.model_dump_json(), nx=True):
            raise RunExists(spec.name)
        now = time.time()
        phase = Phase.estimate if spec.estimation else Phase.publish
        state = {"status": RunStatus.pending.value, "step": 0, "phase": phase.value, "stage": -1, "stage_start": 0, "created_at": now}
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(k.state, mapping={**state, **(extra_state or {})})
        pipe.zadd(keys.RUN_INDEX, {spec.name: now})
        pipe.set(keys.ACTIVE_RUN, spec.name)
        pipe.execute()
        self.run_dir(spec.name).mkdir(parents=True, exist_ok=True)

    def spec(self, run_id: str) -> RunSpec | None:
        raw = self.r.get(keys.RunKeys(run_id).spec)
        return RunSpec.model_validate_json(raw) if raw else None

    def append_stages(self, run_id: str, stages: list[StageConfig], on_plan_end: str | None = None) -> RunSpec:
        """Append `stages` to the plan (and set `on_plan_end` if given) in one transaction: all or
        none, atomically against concurrent appends; RunExists names a stage already in the plan."""
        key = keys.RunKeys(run_id).spec
        with self.r.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    spec = RunSpec.model_validate_json(pipe.get(key))
                    taken = {s.name for s in spec.stages}
                    for stage in stages:
                        if stage.name in taken:
                            raise RunExists(stage.name)
                        taken.add(stage.name)
                    update: dict = {"stages": [*spec.stages, *stages]}
                    if on_plan_end is not None:
                        update["on_plan_end"] = on_plan_end
                    updated = spec.model_copy(update=update)
                    pipe.multi()
                    pipe.set(key, updated.model_dump_json())
                    pipe.execute()
                    return updated
                except redis.WatchError:
                    continue

    def state(self, run_id: str) -> dict[str, str]:
        raw = self.r.hgetall(keys.RunKeys(run_id).state)
        return {k.decode(): v.decode() for k, v in raw.items()}

    def update(self, run_id: str, **fields) -> None:
        self.r.hset(keys.RunKeys(run_id).state, mapping={k: (v.value if isinstance(v, Enum) else v) for k, v in fields.items()})

    def status(self, run_id: str) -> RunStatus | None:
        raw = self.r.hget(keys.RunKeys(run_id).state, "status")
        return RunStatus(raw.decode()) if raw else None

    def finish(self, run_id: str, status: RunStatus, error: str | None = None) -> None:
        fields: dict = {"status": status, "finished_at": time.time()}
        if error:
            fields["error"] = error[:4000]
        self.update(run_id, **fields)
        self.r.delete(keys.RunKeys(run_id).control)
        if self.active() == run_id:
            self.r.delete(keys.ACTIVE_RUN)

    def active(self) -> str | None:
        raw = self.r.get(keys.ACTIVE_RUN)
        return raw.decode() if raw else None

    def list(self) -> list[str]:
        return [x.decode() for x in self.r.zrange(keys.RUN_INDEX, 0, -1)]

    # -- requests from the API to the driver (persisted: a restarted driver sees them) ---------

    def request(self, run_id: str, what: str) -> None:
        """Ask the driver to `pause`, `resume` or `stop`."""
        self.r.hset(keys.RunKeys(run_id).control, what, time.time())
        if what == "resume":
            self.r.hdel(keys.RunKeys(run_id).control, "pause")

    def requested(self, run_id: str) -> set[str]:
        return {k.decode() for k in self.r.hkeys(keys.RunKeys(run_id).control)}

    # -- stages ------------------------------------------------------------------------------

    def stage_records(self, run_id: str) -> list[dict]:
        return [json.loads(x) for x in self.r.lrange(keys.RunKeys(run_id).stages, 0, -1)]

    # -- filtering ---------------------------------------------------------------------------

    def pass_rates(self, run_id: str) -> dict[str, str]:
        """Prompt uid -> "correct/N" from the difficulty estimation."""
        return {a.decode(): b.decode() for a, b in self.r.hgetall(keys.RunKeys(run_id).pass_rates).items()}

    def dropped(self, run_id: str) -> dict[str, dict]:
        """Prompt uid -> {"from_stage": s, "reason": ...} for every prompt filtered out."""
        return {a.decode(): json.loads(b) for a, b in self.r.hgetall(keys.RunKeys(run_id).dropped).items()}

    def estimation(self, run_id: str) -> dict[str, str] | None:
        """The difficulty estimation's progress and counts, or None if the run has none."""
        return {a.decode(): b.decode() for a, b in self.r.hgetall(keys.RunKeys(run_id).estimation).items()} or None

    # -- metrics -----------------------------------------------------------------------------

    def metrics(self, run_id: str, since: int = 0, limit: int | None = None) -> list[dict]:
        """Step records with step >= since (steps are 0, 1, 2, ... so index = step)."""
        end = -1 if limit is None else since + limit - 1
        return [json.loads(x) for x in self.r.lrange(keys.RunKeys(run_id).metrics, since, end)]

    def metrics_count(self, run_id: str) -> int:
        return int(self.r.llen(keys.RunKeys(run_id).metrics))

    def last_metrics(self, run_id: str) -> dict | None:
        raw = self.r.lindex(keys.RunKeys(run_id).metrics, -1)
        return json.loads(raw) if raw else None

    def sync_jsonl(self, run_id: str) -> int:
        """Bring the run's metrics.jsonl up to the records in Redis (Redis is authoritative; the
        file is appended after each step is committed there, and caught up after a restart).
        Returns how many lines were written."""
        path = self.run_dir(run_id) / "metrics.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        have = 0
        if path.exists():
            with path.open("rb") as f:
                have = sum(1 for line in f if line.strip())
        missing = self.r.lrange(keys.RunKeys(run_id).metrics, have, -1)
        if missing:
            with path.open("a") as f:
                f.writelines(x.decode() + "\n" for x in missing)
        return len(missing)
