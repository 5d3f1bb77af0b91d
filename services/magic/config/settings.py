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
from typing import Any, ClassVar
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from magic.runtime import faults


def default_worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class SecretFiles(PydanticBaseSettingsSource):
    """The secret settings of a class (its `secret_files`) read from files: `MAGIC_<FIELD>_FILE`
    names the file holding the value of `MAGIC_<FIELD>` (Docker's `*_FILE` convention, as in the
    official postgres and redis images).

    Why files: an environment variable is visible to everything that can read the process's
    environment (`/proc/<pid>/environ`, `kubectl describe`, crash reports, child processes such
    as the reward sandbox's helpers); a Secret mounted as a file is not, and Kubernetes updates
    the file when the Secret changes. The chart mounts every Secret a pod needs under
    /var/run/secrets/magic and sets only the `*_FILE` variables. Trailing newlines (as left by
    `kubectl create secret --from-file` of an edited file) are dropped, as the chart's Redis does. Setting both a variable and
    its `_FILE` twin, or naming a file that cannot be read, is an error that names the variable.
    """

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # unused: __call__ reads all
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        prefix = str(self.config.get("env_prefix", "")).upper()
        values = {}
        for name in getattr(self.settings_cls, "secret_files", ()):
            var = f"{prefix}{name.upper()}"
            path = os.environ.get(f"{var}_FILE")
            if not path:
                continue
            if os.environ.get(var) is not None:
                raise ValueError(f"both {var} and {var}_FILE are set: set only one (the file is preferred: it keeps the secret out of the environment)")
            try:
                text = Path(path).read_text()
            except OSError as exc:
                raise ValueError(f"{var}_FILE={path}: cannot read the secret file ({exc.strerror})") from exc
            values[name] = text.rstrip("\r\n")
        return values


class MagicSettings(BaseSettings):
    """`MAGIC_*` environment variables; the secret ones (`secret_files`) also from files
    (`MAGIC_<FIELD>_FILE`, see `SecretFiles`). The base of the services' and the CLI's settings."""

    model_config = SettingsConfigDict(env_prefix="MAGIC_", extra="ignore")
    secret_files: ClassVar[tuple[str, ...]] = ()
    """Settings that may be given as a file (MAGIC_<FIELD>_FILE); a subclass adds its own."""

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings):
        """The `*_FILE` variables after the plain ones (both at once are refused: `SecretFiles`)."""
        return init_settings, env_settings, SecretFiles(settings_cls), dotenv_settings, file_secret_settings


class ServiceSettings(MagicSettings):
    """Settings every MAGIC process shares."""

    secret_files: ClassVar[tuple[str, ...]] = ("redis_url", "redis_password")

    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis server holding the streams and the run state. It may carry the password
    (redis://user:password@host:6379/0), or leave it to `redis_password`."""
    redis_password: SecretStr | None = None
    """Password of the Redis user named in `redis_url`, when the URL has none: given as a file
    (MAGIC_REDIS_PASSWORD_FILE, how the Helm chart passes it), the URL itself holds no secret."""
    data_dir: Path = Path(".magic/data")
    """Shared volume: published weights, checkpoints and per-run logs live under it."""
    worker_name: str = Field(default_factory=default_worker_name)
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

    @model_validator(mode="after")
    def _password_into_url(self) -> ServiceSettings:
        """Put `redis_password` into `redis_url` (percent-encoded), which every client connects with."""
        if self.redis_password is None:
            return self
        parts = urlsplit(self.redis_url)
        if parts.password:
            raise ValueError("MAGIC_REDIS_URL already holds a password and MAGIC_REDIS_PASSWORD(_FILE) gives another: give it once")
        user, _, hostport = parts.netloc.rpartition("@")
        auth = f"{user}:{quote(self.redis_password.get_secret_value(), safe='')}"
        self.redis_url = urlunsplit(parts._replace(netloc=f"{auth}@{hostport}"))
        return self

    @field_validator("fault_points")
    @classmethod
    def _known_fault_points(cls, v: str) -> str:
        faults.parse(v)
        return v

    @property
    def armed_faults(self) -> dict[str, int | None]:
        """`fault_points` parsed (see magic.runtime.faults)."""
        return faults.parse(self.fault_points)
