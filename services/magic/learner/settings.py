"""Settings of a learner process (one rank), from `MAGIC_*` environment variables and the launcher's
RANK / WORLD_SIZE / LOCAL_RANK."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from magic.config.settings import ServiceSettings
from magic.weights.config import FilesystemTransportConfig, WeightTransport


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
    stream: bool = True
    """Train each scored group of a step as it arrives and apply the update when the last is in
    (`magic.learner.streaming`: the same update as waiting for the whole batch; with N_SGD > 1
    the no-grad pass and, under minibatch_rule "slot", the first mini-batch stream); false, or a
    step that cannot stream (DeepSpeed, several ranks), trains the whole batch at once."""
    checkpoint_every: int = Field(default=20, ge=0)
    """Write a full checkpoint (HF weights + tokenizer, optimizer, entropy-controller state) of
    every policy version that is a multiple of this; 0: none of these (the checkpoints a run asks
    for — each stage's end, `checkpoint_at_end`, and the best validation, `validation.best_by` —
    are written all the same). The weights themselves reach the volume every step through
    the weight transport; a learner restarted between checkpoints resumes from those published
    weights with a fresh optimizer. At 7B a checkpoint is ≈ 85 GB (fp32 weights + AdamW moments),
    so every step would write more than the whole step's rollouts (docs/scale.md)."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """Checkpoints kept on disk; older ones are deleted."""
    liveness_stall_seconds: float = Field(default=3600.0, gt=0)
    """/livez fails once the learner's loop has not come round for this long. One turn of it is a
    whole training step plus the weight publication, minutes at 7B (docs/scale.md), so the default
    is an hour; lower it to your step time × 2 to catch a hung broadcast sooner."""
    collective_timeout_seconds: float = Field(default=1800.0, ge=60)
    """Timeout of one collective operation between learner ranks: a rank whose peer died (or hangs)
    fails after this long and the job restarts. Within a command the ranks wait for each other at
    most one step's share of work — the slowest rank's micro-batches, rank 0 writing a checkpoint's
    files — ≈ 800 s for a 7B step on 8 H100s (docs/scale.md); the default is that plus ten minutes.
    Waiting for rank 0's next command (between steps, between runs) is not a collective: the
    followers poll the launcher's store for it (`worker.COMMAND_KEY`), so it is not bounded."""
    rank: int = Field(default=0, ge=0, validation_alias="RANK")
    """This process's rank among the learner processes (env RANK, set by the launcher: deepspeed, torchrun)."""
    world_size: int = Field(default=1, ge=1, validation_alias="WORLD_SIZE")
    """Learner processes in all (env WORLD_SIZE, set by the launcher)."""
    local_world_size: int = Field(default=1, ge=1, validation_alias="LOCAL_WORLD_SIZE")
    """Learner processes on this node (env LOCAL_WORLD_SIZE, set by the launcher): the memory plan's ranks per host."""
    max_prompt_tokens: int = Field(default=2048, ge=1)  # memory.DEFAULT_PROMPT_TOKENS
    """The longest prompt (tokens) the memory plan assumes: a stage's longest sequence is this + T
    (`magic.learner.memory`, checked when a run attaches and when a stage starts)."""
    host_memory_bytes: int | None = Field(default=None, gt=0)
    """The memory the plan may use on this host (CPU runs: everything); None: the container's limit
    (cgroup memory.max), unchecked when there is none."""
    check_memory: bool = True
    """Refuse a run or stage whose memory plan does not fit this learner's GPUs (or its container's
    memory limit on CPU) before loading anything (`magic memory` prints the same plan)."""
    local_rank: int = Field(default=0, ge=0, validation_alias="LOCAL_RANK")
    """This process's rank on its node: its GPU index (env LOCAL_RANK, set by the launcher)."""
