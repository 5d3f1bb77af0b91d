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
import logging
import math
import time
from contextlib import AbstractContextManager
from enum import Enum
from pathlib import Path

import redis

from magic.config.schema import RunSpec, StageConfig
from magic.protocol import keys
from magic.protocol.status import Phase, RunStatus
from magic.store.channels import RunChannels
from magic.store.heartbeat import HEARTBEAT_TTL, alive_workers
from magic.runtime.files import write_durably
from magic.store.lease import CONTROLLER, ENDED, Direct, Lease, Writer
from magic.store.retention import Retention
from magic.store.steps import eval_scope, validation_scope


log = logging.getLogger(__name__)

class RunExists(Exception):
    pass


class RunBusy(Exception):
    pass


class KeySquatted(Exception):
    """A key of a run that does not exist yet is in Redis already (made by a process holding a
    worker role's credentials, or left by an operator): the run is not created."""

    def __init__(self, run_id: str, key: str, kind: str):
        super().__init__(
            f"run {run_id!r} cannot be created: Redis already holds its key {key} (a {kind}) though the run does not exist; "
            "someone wrote it before the run (a worker role's credentials, or a leftover): inspect and delete it, or choose another run name"
        )
        self.key = key


_CLAIM = """
if redis.call('exists', KEYS[1]) == 1 then return {'exists'} end
local active = redis.call('get', KEYS[4])
if active and active ~= ARGV[2] then return {'busy', active} end
for i = 5, #KEYS do
  if redis.call('exists', KEYS[i]) == 1 then return {'squatted', KEYS[i], redis.call('type', KEYS[i])['ok']} end
end
redis.call('set', KEYS[1], ARGV[3])
redis.call('hset', KEYS[2], unpack(ARGV, 5))
redis.call('zadd', KEYS[3], ARGV[4], ARGV[2])
redis.call('set', KEYS[4], ARGV[2])
return {'ok'}
"""
"""Create a run in one step: refused if it exists, another run is active, or any of its keys with a
fixed name (every key a worker role may create: `RunKeys.fixed_keys`) exists already; else its
spec, state, index entry and the active pointer. (A SCAN of the run's pattern before it finds the
rest: no worker role can create those, and a SCAN inside a script would block Redis for as long
as the whole keyspace takes.)"""


def finite(record: dict) -> dict:
    """The record with NaN/inf floats replaced by None (JSON has no NaN; the API must not 500)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}


def active_run(r: redis.Redis) -> str | None:
    """The run the workers serve now (absent when idle)."""
    raw = r.get(keys.ACTIVE_RUN)
    return raw.decode() if raw else None


RECORD_FILE = "run.json"
"""The controller's durable record of a run, in its directory under the data volume."""


class Runs:
    """Every run the controller knows: the index, the active-run pointer, creation — in Redis,
    and in each run's durable record (`RECORD_FILE`), which outlives a Redis that lost it."""

    def __init__(self, r: redis.Redis, data_dir: Path, heartbeat_ttl: float = HEARTBEAT_TTL):
        self.r = r
        self.data_dir = Path(data_dir)
        self.heartbeat_ttl = heartbeat_ttl
        """A heartbeat older than this is no live worker (`magic.store.heartbeat.alive_workers`)."""

    def __getitem__(self, run_id: str) -> "RunStore":
        """Run `run_id`'s state as the API sees it (whether or not it exists: `spec` is None if not)."""
        return RunStore(self.r, run_id, self.data_dir, heartbeat_ttl=self.heartbeat_ttl)

    def store(self, run_id: str, writer: Writer) -> "RunStore":
        """Run `run_id`'s state written by `writer` (the lease of the run's driver)."""
        return RunStore(self.r, run_id, self.data_dir, writer, self.heartbeat_ttl)

    def lease(self, run_id: str, holder: str, ttl_seconds: float, role: str = CONTROLLER) -> Lease:
        return Lease(self.r, run_id, role, holder, ttl_seconds)

    def channels(self, run_id: str, consumer: str, max_deliveries: int, fence: Lease | None = None, heartbeat_ttl: float = HEARTBEAT_TTL) -> RunChannels:
        """The controller's channels of run `run_id`."""
        return RunChannels(self.r, run_id, "controller", consumer, max_deliveries, fence, heartbeat_ttl)

    def create(self, spec: RunSpec, extra_state: dict | None = None) -> "RunStore":
        """Store a new run and make it the active one, in one script; raise RunExists / RunBusy, or
        KeySquatted naming a key of the run that exists before it."""
        k = keys.RunKeys(spec.name)
        now = time.time()
        phase = Phase.estimate if spec.estimation else Phase.publish
        state = {"status": RunStatus.pending.value, "step": 0, "phase": phase.value, "stage": -1, "stage_start": 0, "created_at": now}
        fields = [str(x) for kv in {**state, **(extra_state or {})}.items() for x in kv]
        if self.r.exists(k.spec):
            raise RunExists(spec.name)
        for key in self.r.scan_iter(match=k.all_keys_pattern(), count=1000):
            kind = self.r.type(key).decode()
            log.error("run %s: refused: key %s (%s) exists before the run", spec.name, key.decode(), kind)
            raise KeySquatted(spec.name, key.decode(), kind)
        fixed = [key for key in k.fixed_keys() if key not in (k.spec, k.state)]
        got = [x.decode() if isinstance(x, bytes) else x for x in self.r.eval(
            _CLAIM, 4 + len(fixed), k.spec, k.state, keys.RUN_INDEX, keys.ACTIVE_RUN, *fixed, "", spec.name, spec.model_dump_json(), now, *fields
        )]
        if got[0] == "exists":
            raise RunExists(spec.name)
        if got[0] == "busy":
            raise RunBusy(got[1])
        if got[0] == "squatted":
            log.error("run %s: refused: key %s (%s) exists before the run", spec.name, got[1], got[2])
            raise KeySquatted(spec.name, got[1], got[2])
        run = self[spec.name]
        run.run_dir.mkdir(parents=True, exist_ok=True)
        run.record_durably(spec=spec.model_dump(mode="json"), status=RunStatus.pending.value, created_at=now, step=0)
        return run

    def active(self) -> str | None:
        return active_run(self.r)

    def list(self) -> list[str]:
        """Every run, in creation order: those Redis knows and those only their durable record
        remembers (Redis lost them)."""
        known = [x.decode() for x in self.r.zrange(keys.RUN_INDEX, 0, -1)]
        lost = [(rec.get("created_at", 0.0), d.name) for d in self._run_dirs() if d.name not in known and (rec := _read_record(d)).get("spec")]
        return known + [name for _, name in sorted(lost)]

    def _run_dirs(self) -> list[Path]:
        root = self.data_dir / "runs"
        return sorted(d for d in root.iterdir() if (d / RECORD_FILE).is_file()) if root.is_dir() else []

    def lost(self) -> list[str]:
        """Runs whose durable record says they have not ended but whose state Redis lost (all of
        it, or the steps recorded after some point): nobody will drive them again."""
        out = []
        for d in self._run_dirs():
            rec = _read_record(d)
            if rec.get("spec") and rec.get("status") not in ENDED and self[d.name].lost_state(rec) is not None:
                out.append(d.name)
        return out

    def ping(self) -> None:
        """Raises a Redis error unless Redis answers."""
        self.r.ping()


class RunStore:
    """One run's state in Redis (and its metrics.jsonl under the data directory)."""

    def __init__(self, r: redis.Redis, run_id: str, data_dir: Path, writer: Writer | None = None, heartbeat_ttl: float = HEARTBEAT_TTL):
        self.r = r
        self.run_id = run_id
        self.keys = keys.RunKeys(run_id)
        self.data_dir = Path(data_dir)
        self.writer = writer or Direct(r)
        """The driver's lease (`magic.store.lease`): its writes are fenced; the API's are not."""
        self.heartbeat_ttl = heartbeat_ttl

    @property
    def run_dir(self) -> Path:
        return self.data_dir / "runs" / self.run_id

    # -- the durable record (the controller's own, beside Redis) -------------------------------

    def durable(self) -> dict:
        """The run's durable record: {"spec", "status", "error", "step" (steps recorded), "seq"}."""
        return _read_record(self.run_dir)

    def record_durably(self, **fields) -> None:
        """Merge `fields` into the durable record (written atomically and fsynced)."""
        rec = {**self.durable(), **{k: v for k, v in fields.items() if v is not None}, "updated_at": time.time()}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_durably(self.run_dir / RECORD_FILE, json.dumps(rec, sort_keys=True))

    def lost_state(self, record: dict | None = None) -> str | None:
        """Why Redis no longer holds what the durable record says was written (None if it does):
        the run is gone, or fewer steps are recorded than the record counts."""
        rec = self.durable() if record is None else record
        if not rec.get("spec"):
            return None
        if not self.r.exists(self.keys.spec):
            return f"Redis holds nothing of run {self.run_id} (restarted empty?), though {rec.get('step', 0)} steps were recorded"
        if self.metrics_count() < int(rec.get("step", 0)):
            return f"Redis holds {self.metrics_count()} recorded steps of run {self.run_id}, the controller recorded {rec['step']}"
        return None

    # -- the run ------------------------------------------------------------------------------

    def spec(self) -> RunSpec | None:
        """The run's spec: from Redis, or from the durable record of a run Redis lost."""
        raw = self.r.get(self.keys.spec)
        if raw:
            return RunSpec.model_validate_json(raw)
        kept = self.durable().get("spec")
        return RunSpec.model_validate(kept) if kept else None

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
        """The run's state hash; for a run Redis lost, what the durable record says (an ended
        status there wins over a live one in Redis: only a driver that ended the run writes it)."""
        state = {k.decode(): v.decode() for k, v in self.r.hgetall(self.keys.state).items()}
        rec = self.durable()
        if rec.get("status") in ENDED and state.get("status") not in ENDED:
            state.update({"status": rec["status"], "error": rec.get("error") or state.get("error", "")})
            state.setdefault("step", str(rec.get("step", 0)))
            state.setdefault("phase", Phase.publish.value)
        return state

    def update(self, **fields) -> None:
        with self.writer.transaction() as tx:
            self._update(tx, **fields)

    def _update(self, pipe: redis.client.Pipeline, **fields) -> None:
        pipe.hset(self.keys.state, mapping={k: (v.value if isinstance(v, Enum) else v) for k, v in fields.items()})

    def alive(self, service: str) -> dict[str, dict]:
        """Live workers of `service` attached to this run: name -> last heartbeat's status."""
        return alive_workers(self.r, service, self.run_id, max_age=self.heartbeat_ttl)

    def status(self) -> RunStatus | None:
        raw = self.state().get("status")
        return RunStatus(raw) if raw else None

    def finish(self, status: RunStatus, error: str | None = None) -> None:
        """End the run (`status` is terminal): in Redis, then in the run's durable record."""
        fields: dict = {"status": status, "finished_at": time.time()}
        if error:
            fields["error"] = error[:4000]
        active = active_run(self.r) == self.run_id
        with self.writer.transaction() as tx:
            self._update(tx, **fields)
            tx.delete(self.keys.control)
            if active:
                tx.delete(keys.ACTIVE_RUN)
        self.record_durably(status=status.value, error=fields.get("error"))

    # -- requests from the API to the driver (persisted: a restarted driver sees them) ---------

    def request(self, what: str) -> None:
        """Ask the driver to `pause`, `resume` or `stop` (the API's writes: no lease)."""
        with Direct(self.r).transaction() as tx:
            tx.hset(self.keys.control, what, time.time())
            if what == "resume":
                tx.hdel(self.keys.control, "pause")

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
            with self.writer.transaction() as tx:
                tx.lset(key, index, json.dumps(rec))

    def start_stage(self, record: dict, prev_reason: str | None, newly_dropped: list[str]) -> None:
        """Stage `record["index"]` starts at step `record["start_step"]`, in one transaction: the
        prompts it drops by online filtering, the previous stage's end, its record, and the
        state's current stage."""
        k, index = record["start_step"], record["index"]
        rk = self.keys
        prev = json.loads(self.r.lindex(rk.stages, index - 1)) if index > 0 else None
        with self.writer.transaction() as tx:
            for uid in newly_dropped:
                tx.hset(rk.dropped, uid, json.dumps({"from_stage": index, "reason": "solved"}))
            if prev is not None:
                prev.update(end_step=k, end_reason=prev_reason)
                tx.lset(rk.stages, index - 1, json.dumps(prev))
            tx.rpush(rk.stages, json.dumps(record))
            tx.hset(rk.state, mapping={"stage": index, "stage_start": k})

    def retention(self, filter_group: str, enabled: bool = True) -> Retention:
        """The run's stream retention (`magic.store.retention`), writing as this store does."""
        return Retention(self.r, self.run_id, filter_group, enabled=enabled, writer=self.writer)

    def transaction(self) -> AbstractContextManager[redis.client.Pipeline]:
        """A MULTI/EXEC transaction under this store's writer (the lease of the run's driver):
        queue writes on it (the methods that take `pipe`, `StepStore.publish_step`,
        `ConsumerGroup.queue_ack`); executed when the block ends, discarded if the block raises."""
        return self.writer.transaction()

    def set_phase(self, pipe: redis.client.Pipeline, phase: Phase, stage: int) -> None:
        """Queue on `pipe` the barrier's move to `phase` within stage `stage` (with the phase's effect)."""
        pipe.hset(self.keys.state, mapping={"phase": phase.value, "stage": stage})

    def record_step(self, pipe: redis.client.Pipeline, k: int, record: dict) -> None:
        """Queue on `pipe` step k's record and the barrier's move to step k + 1 (phase publish)."""
        rk = self.keys
        pipe.rpush(rk.metrics, json.dumps(record, sort_keys=True))
        pipe.hset(rk.state, mapping={"step": k + 1, "phase": Phase.publish.value, "policy_version": k + 1})
        if record.get("optimizer_reset"):  # the learner resumed step k without its optimizer state: never silent
            pipe.hincrby(rk.state, "optimizer_resets", 1)
            pipe.hset(rk.state, "last_optimizer_reset_step", k)

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
        if not outcomes:
            return
        with self.writer.transaction() as tx:
            for stage, uid, all_correct in outcomes:
                key = self.keys.solved(stage)
                if all_correct:
                    tx.hsetnx(key, uid, 1)
                else:
                    tx.hset(key, uid, 0)

    def begin_estimation(self, prompts: int, samples: int) -> None:
        rk = self.keys
        with self.writer.transaction() as tx:
            tx.hsetnx(rk.estimation, "status", "running")
            tx.hset(rk.estimation, mapping={"prompts": prompts, "samples": samples})

    def estimation_progress(self) -> tuple[int, int]:
        """(prompts published, prompts whose pass rate is in) of the difficulty estimation."""
        rk = self.keys
        return int(self.r.hget(rk.estimation, "published") or 0), int(self.r.hlen(rk.pass_rates))

    def estimation_published(self, pipe: redis.client.Pipeline, published: int) -> None:
        """Queue on `pipe` the count of prompts published for estimation (with their groups)."""
        pipe.hset(self.keys.estimation, "published", published)

    def record_pass_rate(self, uid: str, correct: int, n: int) -> None:
        with self.writer.transaction() as tx:
            tx.hset(self.keys.pass_rates, uid, f"{correct}/{n}")  # idempotent

    def finish_estimation(self, drop: dict[str, str], summary: dict) -> None:
        """Drop the prompts in `drop` (uid -> reason) from stage 0 on, store `summary` and move
        the barrier to `publish`, in one transaction."""
        rk = self.keys
        with self.writer.transaction() as tx:
            for uid, reason in drop.items():
                tx.hset(rk.dropped, uid, json.dumps({"from_stage": 0, "reason": reason}))
            tx.hset(rk.estimation, mapping={"status": "done", **summary})
            tx.hset(rk.state, "phase", Phase.publish.value)

    # -- held-out evaluations: step validations and requested evals (`magic.controller.validation`) --

    def evaluation_published(self, pipe: redis.client.Pipeline, scope: str, groups: int) -> None:
        """Queue on `pipe` the count of groups published for the evaluation `scope` (with the groups)."""
        pipe.hset(self.keys.evaluation(scope), "published", groups)

    def evaluation_progress(self, scope: str) -> tuple[int, dict[str, str]]:
        """(groups published, group id -> outcome JSON of each group received) of the evaluation `scope`."""
        raw = {a.decode(): b.decode() for a, b in self.r.hgetall(self.keys.evaluation(scope)).items()}
        published = int(raw.pop("published", 0))
        return published, raw

    def record_evaluation_outcomes(self, scope: str, outcomes: dict[str, str]) -> None:
        """Store group id -> outcome JSON of received groups of the evaluation `scope` (idempotent:
        a replay writes the same value)."""
        if outcomes:
            with self.writer.transaction() as tx:
                tx.hset(self.keys.evaluation(scope), mapping=outcomes)

    def finish_validation(self, version: int, figures: dict[str, dict]) -> None:
        """Store `version`'s figures per dataset and drop its per-group outcomes, in one transaction."""
        with self.writer.transaction() as tx:
            tx.hset(self.keys.validations, str(version), json.dumps(figures, sort_keys=True))
            tx.delete(self.keys.evaluation(validation_scope(version)))

    def validations(self) -> dict[int, dict[str, dict]]:
        """Policy version -> {dataset: figures} of every finished validation, by version."""
        raw = self.r.hgetall(self.keys.validations)
        return {int(v): json.loads(f) for v, f in sorted(raw.items(), key=lambda kv: int(kv[0]))}

    def validation(self, version: int) -> dict[str, dict] | None:
        raw = self.r.hget(self.keys.validations, str(version))
        return json.loads(raw) if raw else None

    def create_eval(self, config: dict) -> dict:
        """Queue an evaluation of the run's current policy (the API's write: no lease); its record."""
        eval_id = str(self.r.incr(self.keys.eval_seq))
        record = {"id": eval_id, "status": "pending", "config": config, "created_at": time.time()}
        self.r.hset(self.keys.evals, eval_id, json.dumps(record))
        return record

    def evals(self) -> list[dict]:
        """Every requested evaluation's record, by id."""
        return sorted((json.loads(v) for v in self.r.hvals(self.keys.evals)), key=lambda e: int(e["id"]))

    def eval(self, eval_id: str) -> dict | None:
        raw = self.r.hget(self.keys.evals, eval_id)
        return json.loads(raw) if raw else None

    def start_eval(self, pipe: redis.client.Pipeline, record: dict, version: int, context_length: int) -> None:
        """Queue on `pipe` that evaluation `record` runs on policy version `version` with T =
        `context_length` (in the MULTI that publishes its groups)."""
        record = {**record, "status": "running", "policy_version": version, "context_length": context_length, "started_at": time.time()}
        pipe.hset(self.keys.evals, record["id"], json.dumps(record))

    def end_eval(self, eval_id: str, figures: dict[str, dict] | None = None, error: str | None = None) -> None:
        """Evaluation `eval_id` is done (`figures`) or failed (`error`); its per-group outcomes and
        group digests are dropped (a late replay of its groups is only acknowledged)."""
        record = self.eval(eval_id) or {"id": eval_id}
        record.update(status="failed" if error else "done", finished_at=time.time())
        record.update({"error": error[:4000]} if error else {"figures": figures})
        with self.writer.transaction() as tx:
            tx.hset(self.keys.evals, eval_id, json.dumps(record, sort_keys=True))
            tx.delete(self.keys.evaluation(eval_scope(eval_id)), self.keys.groups(eval_scope(eval_id)))

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
        A final validation line (`append_final_validation`) stays last: new steps replace it.
        Returns how many lines were written."""
        path = self.run_dir / "metrics.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []
        last = _json_or_none(lines[-1]) if lines else {}
        dropped = last is None or last.get("final") is True  # a line a crash cut short, or a final validation
        if dropped:
            lines = lines[:-1]
        missing = self.r.lrange(self.keys.metrics, len(lines), -1)
        if dropped and (missing or last is None):  # a cut line always goes; a final validation when steps follow it
            write_durably(path, "".join(ln + "\n" for ln in lines))
        if missing:
            with path.open("a") as f:
                f.writelines(x.decode() + "\n" for x in missing)
        return len(missing)

    def append_final_validation(self, version: int, figures: dict[str, dict]) -> None:
        """The validation of the policy a finished plan ends with (version = steps recorded) as the
        last line of metrics.jsonl — the curve's last point —, once: {"step": version,
        "policy_version": version, "final": true, "validation": figures}. It is no step record
        (GET .../metrics has none for it; GET .../validation has its figures)."""
        self.sync_jsonl()
        path = self.run_dir / "metrics.jsonl"
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []
        if len(lines) != version or (lines and (_json_or_none(lines[-1]) or {}).get("final") is True):
            return  # already there, or the file is not at the plan's end
        with path.open("a") as f:
            f.write(json.dumps(final_validation_record(version, figures), sort_keys=True) + "\n")


def final_validation_record(version: int, figures: dict[str, dict]) -> dict:
    """The last line of a finished plan's metrics.jsonl: the validation of its final policy."""
    return {"step": version, "policy_version": version, "final": True, "validation": figures}


def _json_or_none(line: str) -> dict | None:
    """A metrics.jsonl line as a dict, or None for one a crash cut short."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _read_record(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return {}
