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

    @property
    def events(self) -> str:
        return f"{self._p}:events"

    @property
    def dead(self) -> str:
        return f"{self._p}:dead"

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
        """Hash: one step's bookkeeping (expected groups, publish time, stage)."""
        return f"{self._p}:step:{step}"

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
        """Hash: the learner's progress (last trained step)."""
        return f"{self._p}:learner"

    def all_keys_pattern(self) -> str:
        return f"{self._p}:*"
