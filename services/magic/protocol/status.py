"""A run's status and the position of its step barrier, as the run's state hash and the REST API show them."""

from __future__ import annotations

from enum import Enum


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
