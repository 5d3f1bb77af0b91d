"""Run state in Redis: the spec, the status and barrier position, stage records, per-step metrics.

Everything the controller knows lives here, so a restarted controller picks up where it stopped.
`Runs` is every run (the index, the active-run pointer, creation); `RunStore` is one run's state,
bound to it.

The barrier position is the state hash's `step` (k) and `phase`; the driver moves it forward
only inside the same MULTI/EXEC transaction that does the phase's side effect (publishing the
prompts, recording the step), so a crash leaves either both or neither.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path

import redis

from magic.config.schema import RunSpec, StageConfig
from magic.protocol import keys
from magic.protocol.status import TERMINAL, Phase, RunStatus
from magic.store.channels import RunChannels
from magic.store.heartbeat import alive_workers
from magic.store.lease import RunLease
from magic.store.retention import Retention


class RunExists(Exception):
    pass


class RunBusy(Exception):
    pass


def finite(record: dict) -> dict:
    """The record with NaN/inf floats replaced by None (JSON has no NaN; the API must not 500)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}


def active_run(r: redis.Redis) -> str | None:
    """The run the workers serve now (absent when idle)."""
    raw = r.get(keys.ACTIVE_RUN)
    return raw.decode() if raw else None


class Runs:
    """Every run the controller knows: the index, the active-run pointer, creation."""

    def __init__(self, r: redis.Redis, data_dir: Path):
        self.r = r
        self.data_dir = Path(data_dir)

    def __getitem__(self, run_id: str) -> "RunStore":
        """Run `run_id`'s state (whether or not it exists: `RunStore.spec` is None if not)."""
        return RunStore(self.r, run_id, self.data_dir)

    def channels(self, run_id: str, consumer: str, max_deliveries: int) -> RunChannels:
        return RunChannels(self.r, run_id, consumer, max_deliveries)

    def create(self, spec: RunSpec, extra_state: dict | None = None) -> "RunStore":
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
        run = self[spec.name]
        run.run_dir.mkdir(parents=True, exist_ok=True)
        return run

    def active(self) -> str | None:
        return active_run(self.r)

    def list(self) -> list[str]:
        return [x.decode() for x in self.r.zrange(keys.RUN_INDEX, 0, -1)]

    def ping(self) -> None:
        """Raises a Redis error unless Redis answers."""
        self.r.ping()


class RunStore:
    """One run's state in Redis (and its metrics.jsonl under the data directory)."""

    def __init__(self, r: redis.Redis, run_id: str, data_dir: Path):
        self.r = r
        self.run_id = run_id
        self.keys = keys.RunKeys(run_id)
        self.data_dir = Path(data_dir)

    @property
    def run_dir(self) -> Path:
        return self.data_dir / "runs" / self.run_id

    # -- the run ------------------------------------------------------------------------------

    def spec(self) -> RunSpec | None:
        raw = self.r.get(self.keys.spec)
        return RunSpec.model_validate_json(raw) if raw else None

    def append_stages(self, stages: list[StageConfig], on_plan_end: str | None = None) -> RunSpec:
        """Append `stages` to the plan (and set `on_plan_end` if given) in one transaction: all or
        none, atomically against concurrent appends; RunExists names a stage already in the plan."""
        key = self.keys.spec
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

    def state(self) -> dict[str, str]:
        raw = self.r.hgetall(self.keys.state)
        return {k.decode(): v.decode() for k, v in raw.items()}

    def update(self, **fields) -> None:
        self.r.hset(self.keys.state, mapping={k: (v.value if isinstance(v, Enum) else v) for k, v in fields.items()})

    def alive(self, service: str) -> dict[str, dict]:
        """Live workers of `service` attached to this run: name -> last heartbeat's status."""
        return alive_workers(self.r, service, self.run_id)

    def status(self) -> RunStatus | None:
        raw = self.r.hget(self.keys.state, "status")
        return RunStatus(raw.decode()) if raw else None

    def finish(self, status: RunStatus, error: str | None = None) -> None:
        fields: dict = {"status": status, "finished_at": time.time()}
        if error:
            fields["error"] = error[:4000]
        self.update(**fields)
        self.r.delete(self.keys.control)
        if active_run(self.r) == self.run_id:
            self.r.delete(keys.ACTIVE_RUN)

    # -- requests from the API to the driver (persisted: a restarted driver sees them) ---------

    def request(self, what: str) -> None:
        """Ask the driver to `pause`, `resume` or `stop`."""
        self.r.hset(self.keys.control, what, time.time())
        if what == "resume":
            self.r.hdel(self.keys.control, "pause")

    def requested(self) -> set[str]:
        return {k.decode() for k in self.r.hkeys(self.keys.control)}

    # -- stages ------------------------------------------------------------------------------

    def stage_records(self) -> list[dict]:
        return [json.loads(x) for x in self.r.lrange(self.keys.stages, 0, -1)]

    def close_stage(self, index: int, k: int, reason: str | None) -> None:
        """Record that stage `index` ended before step k (`reason`: "steps", "plateau" or None);
        a stage already closed keeps its record."""
        key = self.keys.stages
        rec = json.loads(self.r.lindex(key, index))
        if rec.get("end_step") is None:
            rec.update(end_step=k, end_reason=reason)
            self.r.lset(key, index, json.dumps(rec))

    def start_stage(self, record: dict, prev_reason: str | None, newly_dropped: list[str]) -> None:
        """Stage `record["index"]` starts at step `record["start_step"]`, in one transaction: the
        prompts it drops by online filtering, the previous stage's end, its record, and the
        state's current stage."""
        k, index = record["start_step"], record["index"]
        rk = self.keys
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

    def lease(self, holder: str, ttl_seconds: float) -> RunLease:
        """The run's lease, as `holder` would hold it (`magic.store.lease`)."""
        return RunLease(self.r, self.run_id, holder, ttl_seconds)

    def retention(self, filter_group: str, enabled: bool = True) -> Retention:
        """The run's stream retention (`magic.store.retention`)."""
        return Retention(self.r, self.run_id, filter_group, enabled=enabled)

    @contextmanager
    def transaction(self) -> Iterator[redis.client.Pipeline]:
        """A MULTI/EXEC transaction: queue writes on it (the methods that take `pipe`, and
        `StepStore.publish_step` / `ConsumerGroup.queue_ack`); it is executed when the block
        ends, and discarded if the block raises."""
        with self.r.pipeline(transaction=True) as pipe:
            yield pipe
            pipe.execute()

    def set_phase(self, pipe: redis.client.Pipeline, phase: Phase, stage: int) -> None:
        """Queue on `pipe` the barrier's move to `phase` within stage `stage` (with the phase's effect)."""
        pipe.hset(self.keys.state, mapping={"phase": phase.value, "stage": stage})

    def record_step(self, pipe: redis.client.Pipeline, k: int, record: dict) -> None:
        """Queue on `pipe` step k's record and the barrier's move to step k + 1 (phase publish)."""
        rk = self.keys
        pipe.rpush(rk.metrics, json.dumps(record, sort_keys=True))
        pipe.hset(rk.state, mapping={"step": k + 1, "phase": Phase.publish.value, "policy_version": k + 1})

    # -- filtering ---------------------------------------------------------------------------

    def pass_rates(self) -> dict[str, str]:
        """Prompt uid -> "correct/N" from the difficulty estimation."""
        return {a.decode(): b.decode() for a, b in self.r.hgetall(self.keys.pass_rates).items()}

    def dropped(self) -> dict[str, dict]:
        """Prompt uid -> {"from_stage": s, "reason": ...} for every prompt filtered out."""
        return {a.decode(): json.loads(b) for a, b in self.r.hgetall(self.keys.dropped).items()}

    def estimation(self) -> dict[str, str] | None:
        """The difficulty estimation's progress and counts, or None if the run has none."""
        return {a.decode(): b.decode() for a, b in self.r.hgetall(self.keys.estimation).items()} or None

    def solved(self, stage: int) -> set[str]:
        """Prompt uids every sample of which was correct in every group of `stage` (so far)."""
        return {u.decode() for u, v in self.r.hgetall(self.keys.solved(stage)).items() if v == b"1"}

    def record_outcomes(self, outcomes: list[tuple[int, str, bool]]) -> None:
        """(stage, prompt uid, every sample correct) of scored groups: a prompt stays solved in a
        stage only while every group of it was all correct (idempotent: replays change nothing)."""
        pipe = self.r.pipeline(transaction=False)
        for stage, uid, all_correct in outcomes:
            key = self.keys.solved(stage)
            if all_correct:
                pipe.hsetnx(key, uid, 1)
            else:
                pipe.hset(key, uid, 0)
        pipe.execute()

    def begin_estimation(self, prompts: int, samples: int) -> None:
        rk = self.keys
        self.r.hsetnx(rk.estimation, "status", "running")
        self.r.hset(rk.estimation, mapping={"prompts": prompts, "samples": samples})

    def estimation_progress(self) -> tuple[int, int]:
        """(prompts published, prompts whose pass rate is in) of the difficulty estimation."""
        rk = self.keys
        return int(self.r.hget(rk.estimation, "published") or 0), int(self.r.hlen(rk.pass_rates))

    def estimation_published(self, pipe: redis.client.Pipeline, published: int) -> None:
        """Queue on `pipe` the count of prompts published for estimation (with their groups)."""
        pipe.hset(self.keys.estimation, "published", published)

    def record_pass_rate(self, uid: str, correct: int, n: int) -> None:
        self.r.hset(self.keys.pass_rates, uid, f"{correct}/{n}")  # idempotent

    def finish_estimation(self, drop: dict[str, str], summary: dict) -> None:
        """Drop the prompts in `drop` (uid -> reason) from stage 0 on, store `summary` and move
        the barrier to `publish`, in one transaction."""
        rk = self.keys
        pipe = self.r.pipeline(transaction=True)
        for uid, reason in drop.items():
            pipe.hset(rk.dropped, uid, json.dumps({"from_stage": 0, "reason": reason}))
        pipe.hset(rk.estimation, mapping={"status": "done", **summary})
        pipe.hset(rk.state, "phase", Phase.publish.value)
        pipe.execute()

    # -- metrics -----------------------------------------------------------------------------

    def metrics(self, since: int = 0, limit: int | None = None) -> list[dict]:
        """Step records with step >= since (steps are 0, 1, 2, ... so index = step)."""
        end = -1 if limit is None else since + limit - 1
        return [json.loads(x) for x in self.r.lrange(self.keys.metrics, since, end)]

    def metrics_count(self) -> int:
        return int(self.r.llen(self.keys.metrics))

    def last_metrics(self) -> dict | None:
        raw = self.r.lindex(self.keys.metrics, -1)
        return json.loads(raw) if raw else None

    def sync_jsonl(self) -> int:
        """Bring the run's metrics.jsonl up to the records in Redis (Redis is authoritative; the
        file is appended after each step is committed there, and caught up after a restart).
        Returns how many lines were written."""
        path = self.run_dir / "metrics.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        have = 0
        if path.exists():
            with path.open("rb") as f:
                have = sum(1 for line in f if line.strip())
        missing = self.r.lrange(self.keys.metrics, have, -1)
        if missing:
            with path.open("a") as f:
                f.writelines(x.decode() + "\n" for x in missing)
        return len(missing)
