"""Weight-transport configurations, chosen by `type` (`magic.weights.factory`): the learner's
and every rollout worker's must agree."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class FilesystemTransportConfig(BaseModel):
    """Weights as versioned safetensors directories on a volume the learner and every rollout pod mount."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["filesystem"] = "filesystem"
    """Transport name."""
    marker_wait_seconds: float = Field(default=60.0, ge=0)
    """How long a rollout worker waits for a version's completion marker to appear (a snapshot still
    being written) before giving up on that version."""


class HttpTransportConfig(BaseModel):
    """The learner serves each version over HTTP; rollout pods download it into a local cache.
    For clusters (and laptops) without a volume shared by the learner and the rollout pods."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["http"] = "http"
    """Transport name."""
    host: str = "0.0.0.0"
    """Interface the learner's weight server listens on."""
    port: int = Field(default=8701, ge=0, le=65535)
    """Port of the learner's weight server (0 picks a free one, for tests)."""
    advertise_url: str | None = None
    """Base URL rollout pods use to reach the weight server (e.g. http://magic-learner:8701);
    unset: http://<hostname>:<port>."""
    cache_dir: Path | None = None
    """Where a rollout worker keeps downloaded versions; unset: <data_dir>/weights-cache/<worker>."""
    timeout_seconds: float = Field(default=600.0, gt=0)
    """Bound on downloading one version."""


class NcclTransportConfig(BaseModel):
    """vLLM's built-in NCCL weight transfer (GPU pods): the learner broadcasts every tensor to the
    vLLM servers of the rollout pods; pods outside the group (new or restarted) load the
    filesystem snapshot of the same version. Needs vLLM servers started with
    `--weight-transfer-config '{"backend": "nccl"}'` and VLLM_SERVER_DEV_MODE=1."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["nccl"] = "nccl"
    """Transport name."""
    master_address: str | None = None
    """Address rollout pods use to reach the learner's rendezvous (its Service name on
    Kubernetes); unset: this host's name."""
    master_port: int = Field(default=29600, ge=1, le=65535)
    """First port of the rendezvous; each new group uses the next one."""
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """Dtype of the broadcast tensors (the vLLM server's model dtype)."""
    packed: bool = True
    """Pack tensors into large buffers for the broadcast (vLLM's packed mode)."""
    packed_buffer_size_bytes: int = Field(default=1 << 30, ge=1 << 20)
    """Size of one packing buffer."""
    packed_num_buffers: int = Field(default=2, ge=1)
    """Packing buffers in flight."""
    snapshot: bool = True
    """Also write each version as a filesystem snapshot (in the background) so new or restarted
    pods can catch up; without it they wait for the next group."""
    member_wait_seconds: float = Field(default=300.0, gt=0)
    """How long the learner waits for the group's members to join or to report a version."""


WeightTransport = Annotated[
    FilesystemTransportConfig | HttpTransportConfig | NcclTransportConfig,
    Field(discriminator="type"),
]
"""Chosen by `type`; set as JSON, e.g. MAGIC_WEIGHT_TRANSPORT='{"type": "http", "port": 8701}'."""
