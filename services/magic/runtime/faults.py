"""Fault injection at named commit points of the on-policy step (testing only).

Every service marks the points of a step where a crash leaves a distinct state in Redis —
before and after each transaction that commits part of the step. The fault-injection suite
(`tests/e2e/test_faults.py`) starts a service with ``MAGIC_FAULT_POINTS=learner.announced@1``
and the process SIGKILLs itself the first time it reaches that point at step 1, exactly as an
OOM kill or a node loss would; the suite then restarts it without the variable.

`POINTS` lists every point; a name outside it is refused when the settings are parsed, so a
typo in a test cannot silently inject nothing.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

POINTS = {
    # controller (services/magic/controller/driver.py)
    "controller.publishing": "inside the publication of step k: its groups built, before the MULTI that publishes them",
    "controller.published": "after the MULTI that publishes step k's prompts and moves the barrier to `rollout`",
    "controller.completed": "after reading StepCompleted(k), before waiting for the rollout workers' version",
    "controller.recording": "inside the recording of step k: its bookkeeping checked, before the MULTI that records it",
    "controller.recorded": "after the MULTI that appends step k's record, moves the barrier to k + 1 and acks StepCompleted",
    "controller.finishing": "the plan is done (after step k), before the run is marked finished",
    # learner (services/magic/learner/worker.py)
    "learner.collected": "step k is complete in the ledger, before training",
    "learner.checkpoint_ready": "checkpoint k is written and hashed, before its fence and rename (on the writer's thread)",
    "learner.trained": "after training (and checkpointing) step k, before preparing its commit",
    "learner.prepared": "after storing the prepared StepCompleted(k), before announcing v(k+1)",
    "learner.announced": "after announcing v(k+1), before the commit MULTI",
    "learner.committed": "after the commit MULTI (last_step = k, acks, StepCompleted(k))",
    # rollout (services/magic/rollout/worker.py)
    "rollout.generated": "a group of step k is generated, before the MULTI that publishes it and acks its prompt",
    "rollout.published": "after publishing a group of step k and acking its prompt",
    "rollout.loaded": "the engine serves v(k+1), before recording the version in `weight_versions`",
    # reward (services/magic/reward/worker.py)
    "reward.scored": "a group of step k is scored, before the MULTI that publishes it and acks its rollout",
    "reward.published": "after publishing a scored group of step k and acking its rollout",
}


PAUSE = "pause"
"""The action suffix that stops the process instead of killing it: `controller.recording@1:pause`."""


def parse(spec: str) -> dict[str, int | None]:
    """`"learner.announced@1,rollout.loaded"` -> {"learner.announced": 1, "rollout.loaded": None}
    (None: at any step); a point armed to pause keeps its `:pause` suffix in its name
    (`"controller.recording@1:pause"` -> {"controller.recording:pause": 1}). Raises ValueError on
    an unknown point, action or a bad step."""
    out: dict[str, int | None] = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        where, _, action = item.partition(":")
        name, _, step = where.partition("@")
        if name not in POINTS:
            raise ValueError(f"unknown fault point {name!r}; known: {sorted(POINTS)}")
        if action not in ("", PAUSE):
            raise ValueError(f"unknown fault action {action!r} of {name!r}; known: {PAUSE!r} (none: SIGKILL)")
        out[f"{name}:{action}" if action else name] = int(step) if step else None
    return out


def point(armed: dict[str, int | None], name: str, step: int) -> None:
    """At the commit point `name` of `step`: SIGKILL this process if the point is armed, or SIGSTOP
    it if armed to pause (the test resumes it with SIGCONT, as a GC pause or a partition would
    end); otherwise do nothing."""
    for key, sig, what in ((name, signal.SIGKILL, "SIGKILL"), (f"{name}:{PAUSE}", signal.SIGSTOP, "SIGSTOP")):
        if key in armed and armed[key] in (None, step):
            log.error("fault injection: %s at %s (step %d)", what, name, step)
            for handler in logging.getLogger().handlers:
                handler.flush()
            if sig is signal.SIGSTOP:
                del armed[key]  # once: the process goes on after SIGCONT
            os.kill(os.getpid(), sig)
