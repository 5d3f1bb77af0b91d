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


class RunFailed(RuntimeError):
    """The run cannot go on; the message is shown in its status."""


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

    def close_stage(self, run_id: str, index: int, k: int, reason: str | None) -> None:
        """Record that stage `index` ended before step k (`reason`: "steps", "plateau" or None);
        a stage already closed keeps its record."""
        key = keys.RunKeys(run_id).stages
        rec = json.loads(self.r.lindex(key, index))
        if rec.get("end_step") is None:
            rec.update(end_step=k, end_reason=reason)
            self.r.lset(key, index, json.dumps(rec))

    def start_stage(self, run_id: str, record: dict, prev_reason: str | None, newly_dropped: list[str]) -> None:
        """Stage `record["index"]` starts at step `record["start_step"]`, in one transaction: the
        prompts it drops by online filtering, the previous stage's end, its record, and the
        state's current stage."""
        k, index = record["start_step"], record["index"]
        rk = keys.RunKeys(run_id)
        pipe = self.r.pipeline(transaction=True)
        for uid in newly_dropped:
            pipe.hset(rk.dropped, uid, json.dumps({"from_stage": index, "reason": "solved"}))
        if index > 0:
            prev = json.loads(self.r.lindex(rk.stages, index - 1))
            prev.update(end_step=k, end_reason=prev_reason)
            pipe.lset(rk.stages, index - 1, json.dumps(prev))
        pipe.rpush(rk.stages, json.dumps(record))
        pipe.hset(rk.state, mapping={"stage": index, "stage_start": k})
        pipe.execute()

    def set_phase(self, pipe: redis.client.Pipeline, run_id: str, phase: Phase, stage: int) -> None:
        """Queue on `pipe` the barrier's move to `phase` within stage `stage` (with the phase's effect)."""
        pipe.hset(keys.RunKeys(run_id).state, mapping={"phase": phase.value, "stage": stage})

    def record_step(self, pipe: redis.client.Pipeline, run_id: str, k: int, record: dict) -> None:
        """Queue on `pipe` step k's record and the barrier's move to step k + 1 (phase publish)."""
        rk = keys.RunKeys(run_id)
        pipe.rpush(rk.metrics, json.dumps(record, sort_keys=True))
        pipe.hset(rk.state, mapping={"step": k + 1, "phase": Phase.publish.value, "policy_version": k + 1})

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

    def solved(self, run_id: str, stage: int) -> set[str]:
        """Prompt uids every sample of which was correct in every group of `stage` (so far)."""
        return {u.decode() for u, v in self.r.hgetall(keys.RunKeys(run_id).solved(stage)).items() if v == b"1"}

    def record_outcomes(self, run_id: str, outcomes: list[tuple[int, str, bool]]) -> None:
        """(stage, prompt uid, every sample correct) of scored groups: a prompt stays solved in a
        stage only while every group of it was all correct (idempotent: replays change nothing)."""
        pipe = self.r.pipeline(transaction=False)
        for stage, uid, all_correct in outcomes:
            key = keys.RunKeys(run_id).solved(stage)
            if all_correct:
                pipe.hsetnx(key, uid, 1)
            else:
                pipe.hset(key, uid, 0)
        pipe.execute()

    def begin_estimation(self, run_id: str, prompts: int, samples: int) -> None:
        rk = keys.RunKeys(run_id)
        self.r.hsetnx(rk.estimation, "status", "running")
        self.r.hset(rk.estimation, mapping={"prompts": prompts, "samples": samples})

    def estimation_progress(self, run_id: str) -> tuple[int, int]:
        """(prompts published, prompts whose pass rate is in) of the difficulty estimation."""
        rk = keys.RunKeys(run_id)
        return int(self.r.hget(rk.estimation, "published") or 0), int(self.r.hlen(rk.pass_rates))

    def estimation_published(self, pipe: redis.client.Pipeline, run_id: str, published: int) -> None:
        """Queue on `pipe` the count of prompts published for estimation (with their groups)."""
        pipe.hset(keys.RunKeys(run_id).estimation, "published", published)

    def record_pass_rate(self, run_id: str, uid: str, correct: int, n: int) -> None:
        self.r.hset(keys.RunKeys(run_id).pass_rates, uid, f"{correct}/{n}")  # idempotent

    def finish_estimation(self, run_id: str, drop: dict[str, str], summary: dict) -> None:
        """Drop the prompts in `drop` (uid -> reason) from stage 0 on, store `summary` and move
        the barrier to `publish`, in one transaction."""
        rk = keys.RunKeys(run_id)
        pipe = self.r.pipeline(transaction=True)
        for uid, reason in drop.items():
            pipe.hset(rk.dropped, uid, json.dumps({"from_stage": 0, "reason": reason}))
        pipe.hset(rk.estimation, mapping={"status": "done", **summary})
        pipe.hset(rk.state, "phase", Phase.publish.value)
        pipe.execute()

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
