"""Settings of a rollout process, from `MAGIC_*` environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from magic.config.settings import ServiceSettings
from magic.weights.config import FilesystemTransportConfig, WeightTransport


class RolloutSettings(ServiceSettings):
    engine: Literal["torch", "vllm"] = "torch"
    """Generation engine: "torch" (this process, CPU or one GPU) or "vllm" (a vLLM OpenAI server beside it)."""
    device: str = "cpu"
    """torch device of the torch engine."""
    max_batch_sequences: int = Field(default=512, ge=1)
    """Most sequences in flight at once: the torch engine's decoding batch, or the requests the
    vLLM engine keeps open. Whole groups are admitted while their gs samples fit."""
    vllm_url: str = "http://127.0.0.1:8000"
    """Base URL of the vLLM OpenAI-compatible server (engine "vllm")."""
    vllm_model: str | None = None
    """`model` field of completion requests (the server's --served-model-name); unset: the server's default."""
    vllm_request_timeout_seconds: float = Field(default=3600.0, gt=0)
    """Bound on one completion request to the vLLM server."""
    vllm_launch: bool = False
    """Start the vLLM server as a child process of this service and supervise it (local runs,
    `magic local --engine vllm`); off on Kubernetes, where the chart runs it as a sidecar at `vllm_url`."""
    vllm_python: Path | None = None
    """Interpreter of the vLLM virtualenv for `vllm_launch`; unset: `<repo>/.venv-vllm/bin/python` (`make vllm-venv`)."""
    vllm_max_model_len: int | None = Field(default=None, ge=16)
    """`--max-model-len` of a launched server (prompt + response tokens); unset: the model's own."""
    vllm_kv_cache_gib: int = Field(default=1, ge=1)
    """KV cache of a launched server on CPU, GiB (`VLLM_CPU_KVCACHE_SPACE`)."""
    vllm_start_timeout_seconds: float = Field(default=600.0, gt=0)
    """How long a launched server may take to answer /health."""
    vllm_extra_args: list[str] = Field(default_factory=list)
    """More command-line arguments for a launched server (JSON list in the environment)."""
    straggler_seconds: float = Field(default=120.0, gt=0)
    """A prompt group still pending at another live worker after this long may be taken over by an
    idle worker and generated again at the same policy version (first copy wins downstream)."""
    weight_transport: WeightTransport = Field(default_factory=FilesystemTransportConfig)
    """How new weights reach this worker; must match the learner's."""
