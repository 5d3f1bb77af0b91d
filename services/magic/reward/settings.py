"""Settings of the reward service (env `MAGIC_*`; nested groups with a double underscore:
`MAGIC_MATH__TIMEOUT_SECONDS=3`, `MAGIC_CODE_JUDGE__URL=http://...`). Only the reward service and the
tools that score like it (`magic local`'s evaluation, the reward benchmarks) read them; the
settings every process shares are `ServiceSettings` in `magic.config.schema`."""

from __future__ import annotations

import os
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


class CodeJudgeClientSettings(BaseModel):
    """Where code answers are judged: the code judge service (`magic.codejudge`), a process of its
    own that runs the programs in its sandbox. Env: ``MAGIC_CODE_JUDGE__<FIELD>``."""

    model_config = ConfigDict(extra="forbid")

    url: str = ""
    """Base URL of the code judge (``http://magic-codejudge:9600``; the chart sets it). Empty:
    no code judge — code samples are judged ``error`` (math-only deployments)."""
    api_token: SecretStr | None = None
    """Bearer token the code judge requires (its ``MAGIC_API_TOKEN``); the chart mounts the same Secret."""
    timeout_seconds: float = Field(default=120.0, gt=0, le=3600)
    """One response's bound, waiting for the judge's verdict (its own limits stop a program sooner)."""
    wait_seconds: float = Field(default=3600.0, ge=0, le=86400)
    """How long a sample waits for a judge that cannot take it (unreachable, restarting, not
    ready, refusing the token) before it is judged ``error``: an outage of the judge is not the
    response's fault. The reward worker's liveness allows the wait."""


class RewardSettings(ServiceSettings):
    """The reward service. Nested groups are set with a double underscore:
    ``MAGIC_MATH__TIMEOUT_SECONDS=3``, ``MAGIC_CODE_JUDGE__URL=http://...``."""

    model_config = SettingsConfigDict(env_prefix="MAGIC_", env_nested_delimiter="__", extra="ignore")
    secret_files: ClassVar[tuple[str, ...]] = (*ServiceSettings.secret_files, "api_token", "code_judge_token")

    math: MathRewardSettings = Field(default_factory=MathRewardSettings)
    """The math verifier."""
    code_judge: CodeJudgeClientSettings = Field(default_factory=CodeJudgeClientSettings)
    """The code judge that runs code answers."""
    code_judge_token: SecretStr | None = Field(default=None, min_length=16)
    """The code judge's bearer token as a file (MAGIC_CODE_JUDGE_TOKEN_FILE, how the chart mounts
    it); `code_judge.api_token` if set, else this. Never the release's API token: the judge runs
    untrusted code and holds only its own token."""
    penalties: PenaltySettings = Field(default_factory=PenaltySettings)
    """Optional penalties."""
    code_data_sources: list[str] = Field(
        default_factory=lambda: ["code", "code/*", "*livecodebench*", "*humaneval*", "*mbpp*", "*taco*", "*apps*", "*codecontests*", "*leetcode*", "*code-*", "*-code*"]
    )
    """`data_source` patterns (fnmatch, case-insensitive) judged by the code judge; every other
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
    code_concurrency: int = Field(default=16, ge=1, le=1024)
    """Code answers sent to the code judge at once (it queues what exceeds its own slots)."""
    read_groups: int = Field(default=8, ge=1, le=1024)
    """Rollout groups taken from the stream at once; their samples are scored concurrently."""
