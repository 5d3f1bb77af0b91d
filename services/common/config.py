"""Typed configuration: process settings from the environment, and the run / stage schema.

Two kinds of configuration live here, each declared once:

* **Settings** (`ServiceSettings` and one subclass per service) come from environment variables
  with the prefix `MAGIC_` — e.g. `MAGIC_REDIS_URL`, `MAGIC_DATA_DIR`. They describe the process:
  where Redis is, where the shared volume is mounted, which port to serve metrics on.
* **The run schema** (`RunSpec`, `StageConfig`, `OptimConfig`) describes the training job. The
  REST API accepts it, the controller stores it in Redis, and the learner and rollout workers
  read it back — one schema everywhere.

The paper's symbols map onto field names once, here (each is also accepted as an alias):

=============  =======================  =====================================================
paper          field                    meaning
=============  =======================  =====================================================
T              ``context_length``       max response tokens; longer responses are truncated
D_R            ``rollout_batch_size``   prompts rolled out per on-policy step
gs             ``group_size``           samples per prompt (the GRPO group)
tau            ``temperature``          sampling temperature (also used for train logprobs)
eps_low/high   ``clip_low/clip_high``   PPO clip range [1 - clip_low, 1 + clip_high]
D_T            ``train_batch_size``     prompts per SGD mini-batch (default D_R)
N_reuse        ``reuse``                passes over each rollout batch
tgt_ent        ``entropy.target``       target entropy of adaptive entropy control
Delta          ``entropy.delta``        step of the adaptive entropy coefficient
beta           ``kl_coef``              weight of the k3 KL to the reference policy
=============  =======================  =====================================================
"""

from __future__ import annotations

import fnmatch
import os
import socket
from enum import Enum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


# --------------------------------------------------------------------------------------------
# Process settings (environment, prefix MAGIC_)
# --------------------------------------------------------------------------------------------


def _default_worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class ClientSettings(BaseSettings):
    """How the `magic` CLI (and any `ControllerClient`) reaches the controller; flags override them."""

    model_config = SettingsConfigDict(env_prefix="MAGIC_", extra="ignore")

    controller_url: str = "http://127.0.0.1:8080"
    """Base URL of the controller's REST API (env MAGIC_CONTROLLER_URL)."""
    api_token: SecretStr | None = None
    """Bearer token sent with every request (env MAGIC_API_TOKEN); unset: none is sent."""


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
    fault_points: str = ""
    """Testing only: `point[@step],...` — the process kills itself (SIGKILL) on reaching one of
    these named commit points of a step (`magic.common.faults`); empty in production."""


    @field_validator("fault_points")
    @classmethod
    def _known_fault_points(cls, v: str) -> str:
        from magic.common import faults

        faults.parse(v)
        return v

    @property
    def armed_faults(self) -> dict[str, int | None]:
        """`fault_points` parsed (see magic.common.faults)."""
        from magic.common import faults

        return faults.parse(self.fault_points)


class ControllerSettings(ServiceSettings):
    host: str = "127.0.0.1"
    """Interface the REST API listens on."""
    port: int = Field(default=8080, ge=0, le=65535)
    """Port of the REST API."""
    api_token: SecretStr | None = Field(default=None, min_length=16)
    """Bearer token every mutating endpoint requires (env MAGIC_API_TOKEN; the Helm chart sets it
    from a Secret). Unset disables authentication, with a warning in the log: development only."""
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
    """Trim each run stream to what its consumers still need (magic.common.retention). false keeps
    every entry for auditing: Redis then grows by a step's rollouts every step (≈ 0.5 GB at the
    paper's shape) until it refuses writes."""


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


class PenaltySettings(BaseModel):
    """Optional reward penalties (`magic.reward.penalties`), each reported separately from
    correctness. Env: ``MAGIC_PENALTIES__<FIELD>`` (the reward service's default), or per stage
    (`StageConfig.penalties`, carried on every prompt group). All are off by default, as in
    Skywork-OR1."""

    model_config = ConfigDict(extra="forbid")

    repetition_max: float = Field(default=0.0, ge=0, le=10)
    """Largest repetition penalty (subtracted from the reward); 0 disables it."""
    repetition_ngram: int = Field(default=3, ge=1, le=64)
    """Size of the word n-grams counted for repetition."""
    overlong_buffer_tokens: int = Field(default=0, ge=0)
    """Soft overlong punishment (DAPO): the last this many tokens before the context length T
    cost up to `overlong_max`, linearly; 0 disables it."""
    overlong_max: float = Field(default=1.0, ge=0, le=10)
    """Penalty of a response that reaches T (and of a truncated one)."""
    repetition_flat: bool = False
    """Flat repetition penalty (the RLOO + entropy bonus + penalties recipe): a response whose
    repeated-n-gram fraction reaches `repetition_threshold` gets exactly -repetition_max, any
    other 0; False grades it: -repetition_max * (repeated fraction)."""
    repetition_threshold: float = Field(default=0.5, gt=0, le=1)
    """Repeated-n-gram fraction (1 - distinct / total word n-grams) at which a response counts as
    repetitive for the flat penalty."""


class LearnerSettings(ServiceSettings):
    device: str = "cpu"
    """torch device of the learner ("cpu", "cuda")."""
    micro_batch_tokens: int = Field(default=16384, ge=64)
    """Token budget of one forward/backward micro-batch (prompt + response tokens, padded)."""
    keep_weight_versions: int = Field(default=3, ge=2)
    """Published weight versions kept on disk; older ones are deleted."""
    weight_transport: WeightTransport = Field(default_factory=FilesystemTransportConfig)
    """How new weights reach the rollout workers; must match theirs."""
    backend: Literal["torch", "deepspeed"] = "torch"
    """Training backend: "torch" (one process, CPU or one GPU) or "deepspeed" (ZeRO across the
    processes a launcher started: `deepspeed`, `torchrun`; RANK / WORLD_SIZE from the environment)."""
    zero_stage: int = Field(default=2, ge=1, le=3)
    """ZeRO stage of the deepspeed backend (1: optimizer state, 2: + gradients, 3: + parameters partitioned)."""
    logprob_chunk_size: int = Field(default=1024, ge=1)
    """Positions whose vocabulary logits are materialised at once when computing log-probs and entropy."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """Training precision. "fp32": weights, activations and optimizer in float32. "bf16": the
    model computes in bfloat16 (weights, activations, gradients) while the optimizer updates
    float32 master weights (and Adam moments); log-probs, entropy, the loss and every
    accumulated figure are computed in float32 from the bfloat16 logits."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them
    (Hugging Face gradient checkpointing, non-reentrant): activation memory of one layer instead
    of all, for about one more forward pass of compute."""
    publish_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Dtype of the weights handed to the weight transport (the rollout engine's model dtype:
    bfloat16 for vLLM). "auto": bfloat16 with precision "bf16", float32 with "fp32". The
    checkpoints always keep the float32 master weights."""
    checkpoint_every: int = Field(default=20, ge=0)
    """Write a full checkpoint (HF weights + tokenizer, optimizer, entropy-controller state) every
    this many steps; 0 disables them. The weights themselves reach the volume every step through
    the weight transport; a learner restarted between checkpoints resumes from those published
    weights with a fresh optimizer. At 7B a checkpoint is ≈ 85 GB (fp32 weights + AdamW moments),
    so every step would write more than the whole step's rollouts (README, "At scale")."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """Checkpoints kept on disk; older ones are deleted."""
    dist_timeout_seconds: float = Field(default=7 * 24 * 3600.0, gt=0)
    """Timeout of collective operations between learner ranks (followers wait for rank 0 between runs)."""
    rank: int = Field(default=0, ge=0, validation_alias="RANK")
    """This process's rank among the learner processes (env RANK, set by the launcher: deepspeed, torchrun)."""
    world_size: int = Field(default=1, ge=1, validation_alias="WORLD_SIZE")
    """Learner processes in all (env WORLD_SIZE, set by the launcher)."""
    local_rank: int = Field(default=0, ge=0, validation_alias="LOCAL_RANK")
    """This process's rank on its node: its GPU index (env LOCAL_RANK, set by the launcher)."""


# --------------------------------------------------------------------------------------------
# The run schema (REST API, controller, learner, rollout)
# --------------------------------------------------------------------------------------------


def _alias(name: str, symbol: str) -> AliasChoices:
    return AliasChoices(name, symbol)


class AdvantageEstimator(str, Enum):
    grpo = "grpo"
    """GRPO group normalisation: (r - mean_group) / (std_group + eps) (paper eq. 2.5)."""
    drgrpo = "drgrpo"
    """Dr.GRPO: r - mean_group, no division by the std."""
    rloo = "rloo"
    """RLOO: r minus the mean of the other samples of the group."""
    batch = "batch"
    """Batch-level normalisation: mean and std over the whole rollout batch."""
    lite_ppo = "lite_ppo"
    """LitePPO: group mean, batch (global) std."""


class AdvantageMask(str, Enum):
    none = "none"
    """Truncated responses keep their (negative) advantage — the recipe's choice (§3.2.3)."""
    before = "before"
    """Truncated responses are left out of the group statistics and get advantage 0 (§3.2.3)."""
    after = "after"
    """Truncated responses count in the group statistics, then get advantage 0 (§3.2.3)."""


class EntropyControl(BaseModel):
    """Adaptive entropy control (§3.2.5): alpha_k = c_k * 1{e_k <= tgt_ent},
    c_{k+1} = c_k + Delta if e_k < tgt_ent, c_k - Delta if e_k > tgt_ent, c_0 = 0, c kept in bounds."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False, use_attribute_docstrings=True)

    adaptive: bool = True
    """Adapt the coefficient as above; False uses `coef` as a constant entropy-bonus coefficient."""
    target: float = Field(default=0.2, ge=0, validation_alias=_alias("target", "tgt_ent"))
    """tgt_ent: target (lower bound) for the policy entropy, nats per token."""
    delta: float = Field(default=0.005, ge=0, validation_alias=_alias("delta", "Delta"))
    """Delta: step of the adaptive coefficient per on-policy step."""
    coef_min: float = Field(default=0.0, ge=0)
    """Lower bound of c_k."""
    coef_max: float = Field(default=0.1, ge=0)
    """Upper bound of c_k."""
    coef: float = Field(default=0.0, ge=0)
    """Constant coefficient when `adaptive` is False (0 disables the entropy bonus)."""

    @model_validator(mode="after")
    def _bounds(self) -> "EntropyControl":
        if self.coef_min > self.coef_max:
            raise ValueError(f"entropy.coef_min ({self.coef_min}) must not exceed entropy.coef_max ({self.coef_max})")
        return self


class PlateauRule(BaseModel):
    """Ends a stage early once a per-step figure stops improving: after at least `min_steps`
    steps, the mean of `metric` over the last `window` steps is compared with the mean over the
    `window` steps before them; the stage ends when it rose by less than `min_delta`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True)

    metric: Literal["accuracy_all", "accuracy_nontruncated", "reward_mean"] = "accuracy_all"
    """Step record figure watched (rollout accuracy by default)."""
    window: int = Field(default=5, ge=1, le=10_000)
    """Steps per window."""
    min_delta: float = Field(default=0.01, ge=0)
    """Smallest rise of the window mean that counts as progress."""
    min_steps: int = Field(default=0, ge=0)
    """Steps the stage runs before the rule is checked (at least 2 * window in any case)."""


class StageConfig(BaseModel):
    """One training stage: a context length T and the batch settings used until its end condition."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False, use_attribute_docstrings=True)

    name: str = Field(default="stage", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Label shown in status and metrics (letters, digits, `_`, `.`, `-`)."""
    steps: int = Field(ge=1, le=1_000_000)
    """End condition: the most on-policy steps this stage runs (all of them without `plateau`)."""
    plateau: PlateauRule | None = None
    """End condition: end the stage before `steps` once `plateau.metric` stops improving."""
    online_filter: bool = True
    """At this stage's start, drop the prompts the policy solved in every sample during the
    previous stage (online filtering, §6); no effect on the first stage."""
    context_length: int = Field(ge=1, le=1_048_576, validation_alias=_alias("context_length", "T"))
    """T: max response tokens; responses longer than T are truncated (finish reason `length`)."""
    rollout_batch_size: int = Field(ge=1, le=65_536, validation_alias=_alias("rollout_batch_size", "D_R"))
    """D_R: prompts rolled out per on-policy step."""
    group_size: int = Field(ge=2, le=1024, validation_alias=_alias("group_size", "gs"))
    """gs: samples per prompt; GRPO normalises rewards within each group."""
    temperature: float = Field(default=1.0, gt=0, le=10, validation_alias=_alias("temperature", "tau"))
    """tau: sampling temperature; the learner divides logits by it too, so ratios match the sampler."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling mass (1.0 = off, as in the recipe)."""
    lr: float = Field(default=1e-6, gt=0, le=1)
    """Learning rate of the optimizer during this stage."""
    clip_low: float = Field(default=0.2, gt=0, lt=1)
    """eps_low: the ratio is clipped below at 1 - clip_low."""
    clip_high: float = Field(default=0.28, gt=0, le=10)
    """eps_high: the ratio is clipped above at 1 + clip_high (clip-higher when > clip_low)."""
    advantage_estimator: AdvantageEstimator = AdvantageEstimator.grpo
    """How rewards become advantages."""
    advantage_mask: AdvantageMask = AdvantageMask.none
    """Advantage mask for truncated responses (§3.2.3)."""
    train_batch_size: int | None = Field(default=None, ge=1, le=65_536, validation_alias=_alias("train_batch_size", "D_T"))
    """D_T: prompts per SGD mini-batch; None means D_R (one SGD step per rollout batch)."""
    reuse: int = Field(default=1, ge=1, le=64, validation_alias=_alias("reuse", "N_reuse"))
    """N_reuse: passes over each rollout batch; N_SGD = D_R / D_T * N_reuse (eq. 4.1)."""
    dual_clip: float | None = Field(default=None, gt=1)
    """c of dual-clip PPO: for negative advantages the per-token loss is capped at -c * A; None disables it."""
    entropy: EntropyControl = Field(default_factory=EntropyControl)
    """Entropy bonus alpha_k * H (§3.2.5)."""
    kl_coef: float = Field(default=0.0, ge=0, validation_alias=_alias("kl_coef", "beta"))
    """beta: weight of the k3 KL to the reference policy (§3.2.6); 0 in the recipe."""
    kl_reference: Literal["initial", "ema"] = "initial"
    """The reference policy of the KL term (beta > 0): "initial", the run's initial model; "ema",
    an exponential moving average of the policy, pi_ref <- d * pi_ref + (1 - d) * pi_theta after
    every on-policy step (d = `kl_ema_decay`), starting from the initial model."""
    kl_ema_decay: float = Field(default=0.99, ge=0, lt=1)
    """d: decay of the EMA reference policy per on-policy step (kl_reference "ema")."""
    minibatch_rule: Literal["count", "size"] = "count"
    """How the groups kept after rejection become SGD mini-batches. "count": always D_R / D_T
    mini-batches per pass (whole groups split as evenly as possible; by samples when fewer
    groups than mini-batches are left), so N_SGD = D_R / D_T * N_reuse exactly (eq. 4.1).
    "size": mini-batches of D_T prompts, so rejection lowers N_SGD (the last one may be smaller)."""
    penalties: PenaltySettings | None = None
    """Reward penalties of this stage, carried on each prompt group to the reward service; None
    leaves the reward service's own settings (MAGIC_PENALTIES__*)."""

    @model_validator(mode="before")
    @classmethod
    def _flat_entropy_symbols(cls, data: object) -> object:
        """The paper's tgt_ent and Delta may be given flat on the stage (as in its tables)."""
        if isinstance(data, dict) and ("tgt_ent" in data or "Delta" in data):
            data = dict(data)
            entropy = data.get("entropy")
            entropy = dict(entropy) if isinstance(entropy, dict) else ({} if entropy is None else entropy)
            if isinstance(entropy, dict):
                for symbol, field in (("tgt_ent", "target"), ("Delta", "delta")):
                    if symbol in data:
                        if field in entropy or symbol in entropy:
                            raise ValueError(f"{symbol} is given twice: flat and as entropy.{field}")
                        entropy[field] = data.pop(symbol)
                data["entropy"] = entropy
        return data

    @field_validator("train_batch_size")
    @classmethod
    def _d_t_divides_d_r(cls, v: int | None, info: ValidationInfo) -> int | None:
        d_r = info.data.get("rollout_batch_size")
        if v is None or d_r is None:
            return v
        if v > d_r:
            raise ValueError(f"D_T = {v} is larger than D_R = {d_r}: a mini-batch cannot hold more prompts than the rollout batch")
        if d_r % v:
            raise ValueError(f"D_R = {d_r} is not divisible by D_T = {v}: pick a D_T that divides D_R (N_SGD = D_R / D_T * N_reuse)")
        return v

    @field_validator("plateau")
    @classmethod
    def _plateau_fits(cls, v: PlateauRule | None, info: ValidationInfo) -> PlateauRule | None:
        steps = info.data.get("steps")
        if v is not None and steps is not None and 2 * v.window > steps:
            raise ValueError(f"plateau.window = {v.window} needs 2 * window <= steps = {steps} steps to compare two windows")
        return v

    @property
    def n_minibatches(self) -> int:
        """D_R / D_T: SGD mini-batches per pass over the rollout batch."""
        return self.rollout_batch_size // (self.train_batch_size or self.rollout_batch_size)

    @property
    def n_sgd(self) -> int:
        """N_SGD = D_R / D_T * N_reuse (paper eq. 4.1); 1 is the on-policy case."""
        return self.n_minibatches * self.reuse


class OptimConfig(BaseModel):
    """AdamW settings shared by every stage (the learning rate is per stage)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.999)
    """Adam's beta1, beta2."""
    eps: float = Field(default=1e-8, gt=0)
    """Adam's epsilon."""
    weight_decay: float = Field(default=0.0, ge=0)
    """Decoupled weight decay."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Gradients are clipped to this global L2 norm."""


RunName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]


PlanEnd = Literal["finish", "wait"]
"""What a run does when its last stage ends: "finish", or "wait" for the next stage."""


def duplicate_stage_name(names: list[str], taken: set[str] | frozenset[str] = frozenset()) -> str | None:
    """The first of `names` that repeats an earlier one or is in `taken` (a run's stage names are
    unique: they label metrics and stage records); None if all are new."""
    seen = set(taken)
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def require_unique_stage_names(names: list[str]) -> None:
    """The validators' check (a run's spec, a plan to append): ValueError naming the repeated name."""
    if (dup := duplicate_stage_name(names)) is not None:
        raise ValueError(f"stage names must be unique within a run: {dup!r} is given twice in {names}")


DatasetName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$")]


class DatasetSpec(BaseModel):
    """A training dataset to register: a JSONL or Parquet file of verl / Skywork-OR1 records
    (`prompt`, `data_source`, `reward_model.ground_truth`, `extra_info`) on a path the controller reads."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: DatasetName
    """Dataset id: lowercase letters, digits, `_`, `.`, `-`."""
    path: str = Field(min_length=1, max_length=4096)
    """File path as the controller sees it (the shared volume on Kubernetes)."""
    format: Literal["auto", "jsonl", "parquet"] = "auto"
    """File format; "auto" picks it from the extension (.jsonl/.json, .parquet)."""


class EstimationConfig(BaseModel):
    """Offline difficulty estimation (§6): sample each prompt N times with the current policy
    and drop the prompts solved 0/N or N/N times from the next stages."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    samples: int = Field(default=16, ge=2, le=1024, validation_alias=_alias("samples", "N"))
    """N: samples per prompt (of every data source `samples_by_source` does not name)."""
    samples_by_source: dict[str, Annotated[int, Field(ge=2, le=1024)]] = Field(default_factory=dict, max_length=64)
    """N per data source: `data_source` pattern (fnmatch, case-insensitive) -> N, first match
    wins, e.g. {"*code*": 8} with samples 16 (the paper: 16 samples for math, 8 for code)."""
    context_length: int = Field(ge=1, le=1_048_576, validation_alias=_alias("context_length", "T"))
    """T: max response tokens of the estimation samples."""
    temperature: float = Field(default=1.0, gt=0, le=10, validation_alias=_alias("temperature", "tau"))
    """tau: sampling temperature."""
    max_prompts: int | None = Field(default=None, ge=1)
    """Estimate only the first this many prompts of the pool (None: all of them)."""
    groups_per_batch: int = Field(default=64, ge=1, le=100_000)
    """Prompt groups published at once (bounds the prompts stream)."""

    def samples_for(self, data_source: str) -> int:
        """N for a prompt of `data_source`.

        >>> EstimationConfig(T=8, N=16, samples_by_source={"*code*": 8}).samples_for("LiveCodeBench")
        8
        """
        ds = data_source.lower()
        return next((n for p, n in self.samples_by_source.items() if fnmatch.fnmatchcase(ds, p.lower())), self.samples)


class RunSpec(BaseModel):
    """A training run: the initial model, the training prompts and the stage plan."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    name: RunName
    """Run id: lowercase letters, digits and dashes (it appears in Redis keys and paths)."""
    model: str = Field(min_length=1, max_length=4096)
    """Initial policy: a Hugging Face model directory readable by the controller, learner and rollout workers."""
    datasets: list[str] = Field(min_length=1, max_length=64, validation_alias=_alias("datasets", "train_files"))
    """Training prompts: names of registered datasets (POST /v1/datasets), or file paths, which
    are registered on the fly under their file stem. Also accepted as `train_files`."""
    stages: list[StageConfig] = Field(default_factory=list, max_length=1000)
    """The stage plan, run in order; more stages can be appended while the run goes."""
    on_plan_end: PlanEnd | None = None
    """What the run does when its last stage ends: "finish", or "wait" for the next stage
    (POST /v1/runs/{run}/stages). Default: "finish" when stages are given, else "wait"."""
    estimation: EstimationConfig | None = None
    """Offline difficulty estimation before the first step (None: none)."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    seed: int = Field(default=0, ge=0, le=2**62)
    """Seeds prompt order and sampling."""

    @model_validator(mode="after")
    def _unique_stage_names(self) -> "RunSpec":
        require_unique_stage_names([s.name for s in self.stages])
        if self.on_plan_end is None:
            self.on_plan_end = "finish" if self.stages else "wait"
        return self

    @property
    def total_steps(self) -> int:
        """Steps of the plan if every stage runs all its `steps` (an upper bound with plateau rules)."""
        return sum(s.steps for s in self.stages)

    def stage_at(self, step: int) -> tuple[int, StageConfig]:
        """The stage index and config that global step `step` (0-based) belongs to when every stage
        runs all its `steps`. The controller decides the real boundaries (plateau rules end stages
        early) and writes each step's stage into the step hash (`RunKeys.step`, field `stage_config`),
        which is what workers should read."""
        for i, stage in enumerate(self.stages):
            if step < stage.steps:
                return i, stage
            step -= stage.steps
        raise ValueError("step is past the end of the plan")
