"""Settings of the code judge (env `MAGIC_*`; the sandbox's with a double underscore:
`MAGIC_SANDBOX__MEMORY_MB=2048`). Only the code judge and the tools that run programs like it
(the code benchmark) read them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import SettingsConfigDict

from magic.config.settings import MagicSettings, default_worker_name


def _cpu_count() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


class SandboxSettings(BaseModel):
    """The code sandbox (`magic.codejudge.sandbox.runner`). Env: ``MAGIC_SANDBOX__<FIELD>``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    """Run programs. The sandbox needs the service to run as root with CAP_SYS_ADMIN (the
    chart's code judge pod, under Pod Security "privileged" in a namespace of its own); where it
    cannot start, the judge refuses to run code (verdict `error`) rather than run untrusted
    programs less confined."""
    slots: int = Field(default_factory=_cpu_count, ge=1, le=256)
    """Programs run at once; each slot has its own uid, scratch space and helper process."""
    cpu_cores: float = Field(default=1.0, gt=0, le=256)
    """CPU one slot's programs may use together: a test whose processes (every process of the
    slot's uid, forked or `setsid`) used more than `cpu_cores` x its elapsed time + 1 s of CPU
    is stopped (`cpu_limit`), so one sample cannot starve the others."""
    uid_base: int = Field(default=61000, ge=1000, le=2**31 - 2)
    """First uid (and gid) of the range the slots' users come from; no other process may use it."""
    uid_count: int = Field(default=256, ge=1, le=65536)
    """Size of that range; slots of several reward processes on one host share it through lock files."""
    root: Path = Path("/tmp/magic-sandbox")
    """Directory for lock files and the helper's private copy (created root-owned, mode 0711)."""
    test_timeout_seconds: float = Field(default=6.0, gt=0, le=600)
    """Wall-clock limit of one test (LiveCodeBench and Skywork-OR1 use 6 s); a test's own
    `time_limit_seconds` in the ground truth overrides it."""
    total_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    """Wall-clock limit of all tests of one response together."""
    memory_mb: int = Field(default=1024, ge=64)
    """Address-space limit of each process of the program (RLIMIT_AS)."""
    total_memory_mb: int = Field(default=2048, ge=64)
    """Memory of all the program's processes together, counted as the kernel charges it:
    resident memory of the slot's processes plus what its tmpfs hold; the test is stopped past
    it (checked every 50 ms)."""
    processes: int = Field(default=32, ge=1, le=4096)
    """Processes and threads the program may have at once (RLIMIT_NPROC of the slot's uid)."""
    file_mb: int = Field(default=64, ge=1)
    """Largest file the program may write (RLIMIT_FSIZE)."""
    disk_mb: int = Field(default=128, ge=1)
    """Size of each of the slot's private tmpfs, /tmp and /dev/shm (counted as the program's
    memory too)."""
    open_files: int = Field(default=256, ge=16, le=65536)
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    max_output_mb: float = Field(default=8.0, gt=0, le=1024)
    """Output (stdout, or reported values) kept per test; a test that writes more fails."""


class CodeJudgeSettings(MagicSettings):
    """The code judge service. No Redis: it answers the reward service over HTTP, nothing else."""

    model_config = SettingsConfigDict(env_prefix="MAGIC_", env_nested_delimiter="__", extra="ignore")
    secret_files: ClassVar[tuple[str, ...]] = ("api_token",)

    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    """The sandbox programs run in."""
    judge_port: int | None = Field(default=None, ge=0, le=65535)
    """Port of POST /v1/judge (env MAGIC_JUDGE_PORT), apart from the metrics port; unset: not served
    (0: a free port)."""
    api_token: SecretStr | None = Field(default=None, min_length=16)
    """Bearer token POST /v1/judge requires (env MAGIC_API_TOKEN or MAGIC_API_TOKEN_FILE). Unset, every
    request is refused (403): the endpoint runs submitted code."""
    max_concurrent: int | None = Field(default=None, ge=1, le=1024)
    """Requests judged at once (the rest wait their turn); default: the sandbox's slots."""
    worker_name: str = Field(default_factory=default_worker_name)
    """This process's name in logs (the pod name on Kubernetes)."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Port for /metrics, /livez and /readyz; unset disables the endpoint (0 picks a free port)."""
    log_level: str = "INFO"
