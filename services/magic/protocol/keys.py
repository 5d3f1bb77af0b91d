"""Redis key names, in one place.

Every key that belongs to a run carries the run id in a hash tag — `magic:{<run>}:...` — so a
Redis Cluster keeps a run's streams and state in one slot and multi-key commands stay legal.
Keys that outlive runs (heartbeats, the active-run pointer) have no tag.
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIVE_RUN = "magic:active_run"
"""String: id of the run the workers serve now (absent when idle)."""
RUN_INDEX = "magic:runs"
"""Sorted set: run ids scored by creation time."""
DATASETS = "magic:datasets"
"""Hash: registered dataset name -> its DatasetInfo as JSON (path, format, summary)."""

# Consumer groups, by the service that consumes the stream (retention trims a stream only up to
# what the groups that need it have acknowledged; see magic.store.retention).
ROLLOUT_GROUP = "rollout"
"""Rollout workers' group on `prompts`."""
REWARD_GROUP = "reward"
"""Reward workers' group on `rollouts`."""
LEARNER_GROUP = "learner"
"""The learner's group on `scored`."""
CONTROLLER_GROUP = "controller"
"""The controller's group on the `events_of(role)` streams and `estimates` (its online-filter group on `scored` is a setting)."""

ROLES = ("controller", "rollout", "reward", "learner")
"""The roles on the bus: each service reaches Redis as its role's ACL user (`magic.store.acl`)."""
SENDERS = ("learner", "rollout", "reward")
"""The roles that send events to the controller, each on a stream of its own (`RunKeys.events_of`)."""


def heartbeat(service: str, worker: str) -> str:
    """String with a TTL, refreshed by a live worker; its value is a JSON status blob."""
    return f"magic:hb:{service}:{worker}"


def heartbeat_pattern(service: str) -> str:
    return f"magic:hb:{service}:*"


@dataclass(frozen=True)
class RunKeys:
    """The keys of one run."""

    run: str

    @property
    def _p(self) -> str:
        return f"magic:{{{self.run}}}"

    # streams
    @property
    def prompts(self) -> str:
        return f"{self._p}:prompts"

    @property
    def rollouts(self) -> str:
        return f"{self._p}:rollouts"

    @property
    def scored(self) -> str:
        return f"{self._p}:scored"

    @property
    def weights(self) -> str:
        return f"{self._p}:weights"

    def events_of(self, role: str) -> str:
        """Stream of the events `role` sends the controller (StepCompleted: the learner's only;
        WorkerError): one stream per sending role, which only that role's ACL user may append to,
        so the controller knows who sent each event (`SENDERS`)."""
        if role not in SENDERS:
            raise ValueError(f"no event stream for role {role!r}; senders: {', '.join(SENDERS)}")
        return f"{self._p}:events:{role}"

    def dead_of(self, role: str) -> str:
        """Stream of the dead letters `role` wrote (poison it met on the streams it consumes): one
        per role, so that no role can trim another's letters."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; known: {', '.join(ROLES)}")
        return f"{self._p}:dead:{role}"

    def dead_streams(self) -> list[str]:
        return [self.dead_of(role) for role in ROLES]

    @property
    def estimates(self) -> str:
        """Stream of ScoredGroups of difficulty-estimation and validation groups (reward ->
        controller), never seen by the learner."""
        return f"{self._p}:estimates"

    # state
    @property
    def spec(self) -> str:
        """String: the RunSpec as JSON."""
        return f"{self._p}:spec"

    @property
    def state(self) -> str:
        """Hash: run status, current step, stage, policy version, timestamps."""
        return f"{self._p}:state"

    def step(self, step: int) -> str:
        """Hash: one step's bookkeeping: `expected` groups, `published_at`, `stage` index and
        `stage_config` (the StageConfig JSON the learner trains the step with)."""
        return f"{self._p}:step:{step}"

    def groups(self, scope: int | str) -> str:
        """Hash: group id -> SHA-256 of the PromptGroup the controller published, per step k
        (or "estimation", "validation:<version>", "eval:<id>"): consumers accept only these groups (`magic.store.steps`)."""
        return f"{self._p}:groups:{scope}"

    def lease(self, role: str) -> str:
        """String with a TTL: "<holder> <epoch>" of the process holding the run's `role` lease
        ("controller": the step driver; "learner": the committing learner; `magic.store.lease`)."""
        return f"{self._p}:lease:{role}"

    def epoch(self, role: str) -> str:
        """Counter: the last epoch of the `role` lease (incremented by every acquisition)."""
        return f"{self._p}:epoch:{role}"

    def seq(self, role: str = "controller") -> str:
        """Counter: writes made under the `role` lease ("controller": `seq`; "learner": `seq:learner`),
        incremented only by that role's writes; a regression of either means Redis lost writes
        (`magic.store.lease.RedisLostData`)."""
        return f"{self._p}:seq" if role == "controller" else f"{self._p}:seq:{role}"

    @property
    def control(self) -> str:
        """Hash: requests from the API to the run's driver ("pause", "resume", "stop") -> when."""
        return f"{self._p}:control"

    @property
    def stages(self) -> str:
        """List: one JSON record per started stage (start/end step, why it ended, filter counts)."""
        return f"{self._p}:stages"

    def solved(self, stage: int) -> str:
        """Hash: prompt uid -> 1 if every sample of every group of the prompt in stage `stage` was
        correct, 0 otherwise (online filtering reads it at the next stage's start)."""
        return f"{self._p}:solved:{stage}"

    @property
    def dropped(self) -> str:
        """Hash: prompt uid -> JSON {"from_stage": s, "reason": "solved"|"estimated_0"|"estimated_all"}:
        the prompt is left out of stage s and every later stage."""
        return f"{self._p}:dropped"

    @property
    def pass_rates(self) -> str:
        """Hash: prompt uid -> "correct/N" from the last difficulty estimation."""
        return f"{self._p}:pass_rates"

    def evaluation(self, scope: str) -> str:
        """Hash: the held-out evaluation in progress under `scope` ("validation:<version>" or
        "eval:<id>", `magic.store.steps`): `published` (groups published) and, per group id
        received, the outcome of its samples as JSON."""
        return f"{self._p}:evaluation:{scope}"

    @property
    def validations(self) -> str:
        """Hash: policy version -> JSON {dataset: figures} of each finished validation
        (`magic.evaluation.Figures`)."""
        return f"{self._p}:validations"

    @property
    def evals(self) -> str:
        """Hash: eval id -> JSON record of each requested evaluation (POST /v1/runs/{run}/evals):
        config, status pending|running|done|failed, policy version, figures."""
        return f"{self._p}:evals"

    @property
    def eval_seq(self) -> str:
        """Counter: the last eval id given out."""
        return f"{self._p}:eval_seq"

    @property
    def estimation(self) -> str:
        """Hash: the difficulty estimation's progress and counts (status, published, received, dropped)."""
        return f"{self._p}:estimation"

    @property
    def weight_versions(self) -> str:
        """Hash: rollout worker -> policy version it has loaded."""
        return f"{self._p}:weight_versions"

    @property
    def metrics(self) -> str:
        """List: per-step metric records as JSON, in step order."""
        return f"{self._p}:metrics"

    @property
    def learner_state(self) -> str:
        """Hash: the learner's committed progress: `last_step`, `entropy_coef`, and `prepared` (a
        serialized StepCompleted between preparing and committing a step; `magic.store.steps`)."""
        return f"{self._p}:learner"

    def all_keys_pattern(self) -> str:
        return f"{self._p}:*"

    def fixed_keys(self) -> list[str]:
        """Every key of the run whose name does not depend on a step, stage or scope: among them all
        those a worker role's ACL user may create (`magic.store.runs`' claim checks them)."""
        names = [getattr(self, n) for n, v in vars(RunKeys).items() if isinstance(v, property) and not n.startswith("_")]
        names += [self.events_of(role) for role in SENDERS] + [self.dead_of(role) for role in ROLES] + [f"{self.dead_of(role)}:seen" for role in ROLES]
        names += [k for role in ("controller", "learner") for k in (self.lease(role), self.epoch(role), self.seq(role))]
        return names
