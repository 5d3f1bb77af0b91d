"""Settings of the controller process and of its clients (the `magic` CLI), from `MAGIC_*` variables."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr

from magic.config.settings import MagicSettings, ServiceSettings


class ClientSettings(MagicSettings):
    """How the `magic` CLI (and any `ControllerClient`) reaches the controller; flags override them."""

    secret_files: ClassVar[tuple[str, ...]] = ("api_token",)
    """Also read from a file: MAGIC_API_TOKEN_FILE (`magic.config.settings.SecretFiles`)."""

    controller_url: str = "http://127.0.0.1:8080"
    """Base URL of the controller's REST API (env MAGIC_CONTROLLER_URL)."""
    api_token: SecretStr | None = None
    """Bearer token sent with every request (env MAGIC_API_TOKEN or MAGIC_API_TOKEN_FILE); unset: none is sent."""

class ControllerSettings(ServiceSettings):
    secret_files: ClassVar[tuple[str, ...]] = (*ServiceSettings.secret_files, "api_token")
    host: str = "127.0.0.1"
    """Interface the REST API listens on."""
    port: int = Field(default=8080, ge=0, le=65535)
    """Port of the REST API."""
    api_token: SecretStr | None = Field(default=None, min_length=16)
    """Bearer token every mutating endpoint requires (env MAGIC_API_TOKEN, or a file named by
    MAGIC_API_TOKEN_FILE: how the Helm chart passes its Secret). Unset disables authentication, with a warning in the log: development only."""
    read_requires_token: bool = False
    """Also require the token on every GET of the API (/v1/...): runs, datasets, metrics show
    model and dataset paths. The probes (/livez, /readyz) and /metrics stay open. Off by default
    for local use; the Helm chart turns it on (env MAGIC_READ_REQUIRES_TOKEN)."""
    lease_seconds: float = Field(default=10.0, gt=0, le=600)
    """A run is driven by one controller at a time, which renews a lease in Redis; a controller
    that died (even SIGKILLed) is replaced once its lease expires after this long."""
    filter_group: str = "controller-filter"
    """Consumer group the controller reads the `scored` stream with (per-prompt outcomes for
    online filtering); the learner's own group is untouched."""
    worker_wait_seconds: float = Field(default=600.0, gt=0)
    """How long a step may wait for workers (weights acks, a learner) before the run fails."""
    step_timeout_seconds: float = Field(default=3600.0, gt=0)
    """Upper bound on one on-policy step (rollout + reward + train); the run fails past it."""
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    """Largest request body the REST API reads (413 beyond it), checked before parsing or
    authentication; datasets are registered by path, so bodies stay small."""
    trim_streams: bool = True
    """Trim each run stream to what its consumers still need (magic.store.retention). false keeps
    every entry for auditing: Redis then grows by a step's rollouts every step (≈ 0.5 GB at the
    paper's shape) until it refuses writes."""
