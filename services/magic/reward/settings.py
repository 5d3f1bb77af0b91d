"""Settings of the reward service (env `MAGIC_*`; nested groups with a double underscore:
`MAGIC_MATH__TIMEOUT_SECONDS=3`, `MAGIC_SANDBOX__MEMORY_MB=2048`). Only the reward service and the
tools that score like it (`magic local`'s evaluation, the reward benchmarks) read them; the
settings every process shares are `ServiceSettings` in `magic.config.schema`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from magic.config.schema import PenaltySettings
from magic.config.settings import ServiceSettings


def _cpu_count() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


class JudgeSettings(BaseModel):
    """The optional LLM judge (`magic.reward.math.judge`): asked only about math answers the
    rules reject, as TinyV does. Env: ``MAGIC_MATH__JUDGE__<FIELD>``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    """Off by default: the rules alone decide (their false positives are measured; a judge's
    depend on its model)."""
    url: str = ""
    """Base URL of an OpenAI-compatible server (a vLLM server, as the rollout runs), e.g.
    ``http://judge:8000``; the judge posts to ``<url>/v1/completions``."""
    model: str = ""
    """The served model's name (vLLM's ``--served-model-name``, or its path)."""
    api_key: SecretStr | None = None
    """Sent as a bearer token when set."""
    timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    """One question's bound; past it the rules' verdict stands."""
    max_tokens: int = Field(default=1, ge=1, le=64)
    """Tokens the judge may write; its decision is read from the first word ("True"/"False":
    one token in the usual tokenizers)."""

    @model_validator(mode="after")
    def _needs_a_server(self) -> "JudgeSettings":
        if self.enabled and not (self.url and self.model):
            raise ValueError("the LLM judge needs a url and a model (MAGIC_MATH__JUDGE__URL, MAGIC_MATH__JUDGE__MODEL)")
        return self


class MathRewardSettings(BaseModel):
    """The math verifier (`magic.reward.math.verifier`). Env: ``MAGIC_MATH__<FIELD>``."""

    model_config = ConfigDict(extra="forbid")

    verifier: str = "magic"
    """Registered verifier: "magic" (default) or "skywork-or1" (the paper's plain procedure)."""
    timeout_seconds: float = Field(default=5.0, gt=0, le=600)
    """Hard wall-clock bound on verifying one response; past it the worker process is killed
    and the verdict is `timeout` (reward 0)."""
    workers: int = Field(default_factory=_cpu_count, ge=1, le=256)
    """Verifier processes: how many responses are verified at once."""
    memory_mb: int = Field(default=2048, ge=256)
    """Address-space limit of each verifier process (a huge number cannot exhaust the pod)."""
    judge: JudgeSettings = Field(default_factory=JudgeSettings)
    """The optional LLM judge, asked only when the rules reject an answer."""


class SandboxSettings(BaseModel):
    """The code sandbox (`magic.reward.sandbox.runner`). Env: ``MAGIC_SANDBOX__<FIELD>``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    """Judge code answers. The sandbox needs the service to run as root with CAP_SYS_ADMIN (the
    chart's reward pod under Pod Security "privileged"); where it cannot start, the service
    refuses to judge code (verdict `error`) rather than run untrusted programs less confined.
    false turns code judging off on purpose (math-only deployments)."""
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



class RewardSettings(ServiceSettings):
    """The reward service. Nested groups are set with a double underscore:
    ``MAGIC_MATH__TIMEOUT_SECONDS=3``, ``MAGIC_SANDBOX__MEMORY_MB=2048``."""

    model_config = SettingsConfigDict(env_prefix="MAGIC_", env_nested_delimiter="__", extra="ignore")
    secret_files: ClassVar[tuple[str, ...]] = (*ServiceSettings.secret_files, "api_token")

    math: MathRewardSettings = Field(default_factory=MathRewardSettings)
    """The math verifier."""
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    """The code sandbox."""
    penalties: PenaltySettings = Field(default_factory=PenaltySettings)
    """Optional penalties."""
    code_data_sources: list[str] = Field(
        default_factory=lambda: ["code", "code/*", "*livecodebench*", "*humaneval*", "*mbpp*", "*taco*", "*apps*", "*codecontests*", "*leetcode*", "*code-*", "*-code*"]
    )
    """`data_source` patterns (fnmatch, case-insensitive) judged by the code sandbox; every other
    data source is judged as a math answer."""
    api_token: SecretStr | None = Field(default=None, min_length=16)
    """Bearer token POST /v1/score requires (env MAGIC_API_TOKEN or MAGIC_API_TOKEN_FILE, the
    controller's token; the Helm chart mounts the same Secret). Unset, the endpoint refuses every request (403):
    it runs submitted code."""
    score_port: int | None = Field(default=None, ge=0, le=65535)
    """Port of POST /v1/score (env MAGIC_SCORE_PORT), apart from the metrics port so that opening
    /metrics to Prometheus never opens an endpoint that runs code; unset: not served (0: a free port)."""
    max_request_samples: int = Field(default=1024, ge=1)
    """Most samples one POST /v1/score request may carry."""
    read_groups: int = Field(default=8, ge=1, le=1024)
    """Rollout groups taken from the stream at once; their samples are scored concurrently."""
