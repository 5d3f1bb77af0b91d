"""Process settings every MAGIC process shares, read from `MAGIC_*` environment variables.

Each service declares its own settings next to it, as a subclass (`magic.controller.settings`,
`magic.rollout.settings`, `magic.reward.settings`, `magic.learner.settings`); they describe the
process — where Redis is, where the shared volume is mounted, which port serves metrics — never
the training job, which is the run schema (`magic.config.schema`).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from magic.runtime import faults


def _default_worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class ServiceSettings(BaseSettings):
    """Settings every MAGIC process shares. Read from `MAGIC_*` environment variables."""

    model_config = SettingsConfigDict(env_prefix="MAGIC_", extra="ignore")

    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis server holding the streams and the run state."""
    data_dir: Path = Path(".magic/data")
    """Shared volume: published weights, checkpoints and per-run logs live under it."""
    worker_name: str = Field(default_factory=_default_worker_name)
    """This process's name as a stream consumer and in heartbeats (the pod name on Kubernetes)."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Port for /metrics, /livez and /readyz; unset disables the endpoint (0 picks a free port)."""
    log_level: str = "INFO"
    """Python logging level."""
    torch_threads: int | None = Field(default=None, ge=1)
    """Intra-op threads for torch on CPU; unset leaves torch's default."""
    heartbeat_seconds: float = Field(default=2.0, gt=0)
    """How often the process refreshes its heartbeat in Redis."""
    heartbeat_ttl_seconds: float = Field(default=10.0, gt=0)
    """A worker whose heartbeat is older than this is considered dead; its pending messages are reclaimed."""
    max_deliveries: int = Field(default=5, ge=1)
    """A stream entry delivered this many times without being acknowledged goes to the dead-letter stream."""
    liveness_stall_seconds: float = Field(default=600.0, gt=0)
    """/livez fails (and the heartbeat stops) once the main loop has not come round for this long
    (`magic.runtime.liveness`): longer than the longest single unit of work of the service."""
    attach_timeout_seconds: float = Field(default=1800.0, gt=0)
    """How long attaching to a run (loading the model) may take before the process counts as hung."""
    fault_points: str = ""
    """Testing only: `point[@step],...` — the process kills itself (SIGKILL) on reaching one of
    these named commit points of a step (`magic.runtime.faults`); empty in production."""


    @field_validator("fault_points")
    @classmethod
    def _known_fault_points(cls, v: str) -> str:
        faults.parse(v)
        return v

    @property
    def armed_faults(self) -> dict[str, int | None]:
        """`fault_points` parsed (see magic.runtime.faults)."""
        return faults.parse(self.fault_points)
