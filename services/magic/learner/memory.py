"""The learner's memory plan: peak memory per GPU (rank) and per host, by component, before any GPU is paid for.

    plan(model, shape) -> MemoryPlan        pure arithmetic over a model's config.json and the learner's shape

The same function answers `magic memory` (the CLI, from a model directory or config.json and the
chart's values) and the learner's check when a run attaches and when a stage starts
(`stage_problems`, `LearnerWorker.check_stage`: a stage that does not fit fails the run with the
knob to turn, before any weight is loaded). Components, per rank, for P parameters, W = gpus ×
nodes ranks, b bytes per weight (2 in bf16, 4 in fp32). The peak is what a rank holds throughout
(runtime, weights, gradients, optimizer, zero_buffers, reference) plus the largest of its phases'
working sets: forward/backward (gathered, activations, logits), the optimizer step
(optimizer_step), publishing (publish, rank 0):

| component | bytes per rank |
| --- | --- |
| weights | P·b, ÷W under ZeRO-3 (`loading`: partitioned from construction) |
| gradients | P·b under ZeRO-1, P·b/W + the reduce bucket under ZeRO-2/3 |
| optimizer | 12·P/W: float32 masters + AdamW's two moments, partitioned (DeepSpeed); the torch backend keeps 8·P (fp32) or 12·P (bf16) |
| zero_buffers | DeepSpeed's own flat buffers, `ZERO_BUFFER_BYTES` per partition element (measured) |
| optimizer_step | the step's working set: 12 bytes per element stepped at once (the float32 gradient copy and AdamW's temporaries): the partition (ZeRO-1/2), a 1e8-element sub-group (ZeRO-3) |
| gathered | ZeRO-3: the parameters gathered for the current and the prefetched layer (2 × the largest of a decoder layer and the vocabulary matrix) |
| publish | rank 0: one gathered bucket of the published weights (1 GiB, or the largest tensor) |
| activations | N·L·a (all layers' saved tensors), with activation checkpointing N·L·h·b + 1.7·N·a (the layer inputs, one layer recomputed and its gradients) |
| logits | the output layer's chunked log-probs: c·chunk·V·4 (float32 chunks) + V·h·4 (the output matrix's gradient) |
| reference | kl_reference "initial": P·b, ÷W under ZeRO-3; "ema": P·4 (a float32 replica on every rank) |
| stream_buffers | a streamed step (torch backend, `magic.learner.streaming`): P·4 per loss term whose gradient it accumulates apart (`stream_buffer_count`) |
| runtime | CUDA context and NCCL buffers (GPU, assumed 1.5 GiB); the Python process with torch and DeepSpeed (CPU, measured) |

N is the tokens of one micro-batch: `micro_batch_tokens`, or prompt + T when one sequence is longer
(a sequence is never split). a, the saved activation bytes per token of one decoder layer, is
a_h·h + a_i·i with (a_h, a_i) = (51, 19.5) bytes in float32 and (46.5, 8.8) in bf16 (RMSNorm and
softmax statistics stay float32), measured with Hugging Face's Qwen2 layers and SDPA attention
(no N² term) on this project's CPU machine (`benchmarks/learner_memory.py --calibrate`).
`benchmarks/learner_memory.py` checks the whole plan against the measured peak memory of
DeepSpeed ranks on CPU (docs/learner.md, "Memory plan").

Per host (a learner pod): its ranks' host memory — the runtime of each process (3 GiB on a GPU
node: Python, torch, CUDA and NCCL libraries; assumed), the load working set (one tensor at a
time, read with `pread`), rank 0's host copy of a publish bucket, and with the `nccl` transport
rank 0's host copy of the whole model for the filesystem snapshot — or, on CPU, everything above.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

GiB = 1024**3

WEIGHT_BYTES = {"fp32": 4, "bf16": 2}

ACTIVATION_BYTES = {"fp32": (51.0, 19.5), "bf16": (46.5, 8.8)}
"""(a_h, a_i): saved activation bytes per token of one decoder layer per unit of hidden size and of
intermediate size, peak of forward + backward (measured, see the module docstring)."""

CHECKPOINT_RECOMPUTE = 1.7
"""With activation checkpointing, the peak holds about 1.7 layers' activations: the recomputed
layer's saved tensors and the gradients flowing through it (measured)."""

LOGIT_BUFFERS = {"fp32": 1.3, "bf16": 2.4}
"""float32 chunk × vocabulary buffers alive at once in `ChunkedLogpEntropy` (bf16 adds the
bfloat16 logits and their upcast; measured)."""

GPU_RUNTIME_BYTES = int(1.5 * GiB)
"""CUDA context, cuBLAS workspaces and NCCL buffers of one rank (assumed, not measured here)."""
GPU_HOST_RUNTIME_BYTES = 3 * GiB
"""Host memory of one GPU rank's process: Python, torch, DeepSpeed, CUDA and NCCL libraries (assumed)."""
CPU_RUNTIME_BYTES = int(0.45 * GiB)
"""A CPU rank's process with torch, transformers and DeepSpeed imported and gloo joined (measured)."""

DEFAULT_PROMPT_TOKENS = 2048
"""The longest prompt the plan assumes unless told (`magic memory --prompt-tokens`, `MAGIC_MAX_PROMPT_TOKENS`)."""
CHART_MEMORY_PER_RANK_LIMIT_GI = 48
"""The chart's `learner.memoryPerRank.limitGi` default: a values file that sets neither it nor the
learner's memory limit gets the chart's."""

DEFAULT_MARGIN = 0.10
"""Share of the device kept free: allocator fragmentation and what the plan does not count."""

ZERO_BUCKET_ELEMENTS = 50_000_000
"""Elements of DeepSpeed's gradient reduce and all-gather buckets (ZeRO-1/2) and of ZeRO-3's
prefetch bucket (`backends.deepspeed_config`): 100 MB in bf16, 200 MB in float32 (DeepSpeed's own
defaults are 5e8 for the first two: 1-2 GB a rank)."""
SUB_GROUP_ELEMENTS = 2 * ZERO_BUCKET_ELEMENTS
"""ZeRO-3's `sub_group_size`: the optimizer steps the partition this many elements at a time."""
PUBLISH_BUCKET_BYTES = GiB
"""Bytes of one bucket of published weights (`Backend.state_dict_buckets`): rank 0's working set
beyond its own share when the weights are gathered for publishing and for checkpoints' HF copy."""


class ModelShapeError(ValueError):
    """A config.json the plan cannot read (not a dense decoder-only transformer it knows)."""


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a dense decoder-only transformer (Llama, Qwen2, Mistral families)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied_embeddings: bool
    attention_bias: bool
    name: str = ""

    @classmethod
    def from_config(cls, cfg: dict, name: str = "") -> ModelShape:
        if any(k in cfg for k in ("num_experts", "num_local_experts", "n_routed_experts")):
            raise ModelShapeError(f"{name or 'the model'}: a mixture-of-experts config; the memory plan covers dense decoder models only")
        try:
            h = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            shape = cls(
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=h,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or h // heads),
                tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
                name=name,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelShapeError(f"{name or 'config.json'}: not a decoder config the memory plan reads ({type(exc).__name__}: {exc})") from None
        if min(shape.vocab_size, shape.hidden_size, shape.intermediate_size, shape.num_layers, shape.num_heads) <= 0:
            raise ModelShapeError(f"{name or 'config.json'}: non-positive dimensions")
        return shape

    @classmethod
    def from_path(cls, path: str | Path) -> ModelShape:
        """From a model directory or its config.json."""
        p = Path(path)
        file = p / "config.json" if p.is_dir() else p
        try:
            cfg = json.loads(file.read_text())
        except OSError as exc:
            raise ModelShapeError(f"{file}: cannot read ({exc.strerror or exc})") from None
        except json.JSONDecodeError as exc:
            raise ModelShapeError(f"{file}: not JSON ({exc})") from None
        if not isinstance(cfg, dict):
            raise ModelShapeError(f"{file}: not a config object")
        return cls.from_config(cfg, name=str(p))

    @property
    def layer_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        q, kv = self.num_heads * d, self.num_kv_heads * d
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.attention_bias else 0)
        return attn + 3 * h * self.intermediate_size + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        return self.num_layers * self.layer_params + self.embedding_params * (1 if self.tied_embeddings else 2) + self.hidden_size


@dataclass(frozen=True)
class LearnerShape:
    """How the learner trains: its ranks, ZeRO stage, precision and micro-batches (the chart's
    `learner.*` values and the learner's `MAGIC_*` settings)."""

    gpus: int = 1
    """Ranks per node (GPUs of a learner pod; 1 on CPU)."""
    nodes: int = 1
    backend: Literal["torch", "deepspeed"] = "deepspeed"
    zero_stage: int = 2
    precision: Literal["fp32", "bf16"] = "bf16"
    activation_checkpointing: bool = True
    micro_batch_tokens: int = 16384
    sequence_tokens: int = 16384
    """The longest sequence trained: prompt tokens + T."""
    logprob_chunk_size: int = 1024
    reference: Literal["none", "initial", "ema"] = "none"
    publish_bucket_bytes: int = PUBLISH_BUCKET_BYTES
    device: Literal["cuda", "cpu"] = "cuda"
    device_bytes: int | None = 80 * 10**9
    """Memory of one GPU (80 GB for an H100/A100 80GB); None: not checked."""
    host_bytes: int | None = None
    """Memory limit of one learner pod (its container's limit); None: not checked."""
    stream_buffers: int = 0
    """Policy-sized float32 gradient buffers a streamed step holds (`stream_buffer_count`)."""
    host_weight_copy: bool = False
    """Rank 0 keeps a host copy of the whole published model (the `nccl` transport's filesystem
    snapshot for pods outside the broadcast group, written in the background)."""
    margin: float = DEFAULT_MARGIN

    @property
    def world(self) -> int:
        return max(1, self.gpus) * max(1, self.nodes)

    @property
    def tokens(self) -> int:
        return max(self.micro_batch_tokens, self.sequence_tokens)


@dataclass
class MemoryPlan:
    model: ModelShape
    shape: LearnerShape
    per_rank: dict[str, int]
    """Peak bytes of one rank's device (GPU; the process on CPU), by component (rank 0: + publish)."""
    per_host: dict[str, int]
    problems: list[str] = field(default_factory=list)

    @property
    def rank_total(self) -> int:
        return peak_bytes(self.per_rank)

    @property
    def host_total(self) -> int:
        return sum(self.per_host.values())

    @property
    def fits(self) -> bool:
        return not self.problems

    def table(self) -> str:
        s, m = self.shape, self.model
        head = (
            f"model {m.name or '?'}: {m.params / 1e9:.2f}B parameters ({m.num_layers} layers, hidden {m.hidden_size}, vocab {m.vocab_size})\n"
            f"learner: {s.world} rank(s) ({s.gpus} per node x {s.nodes} node(s)), {s.backend}"
            f"{f' ZeRO-{s.zero_stage}' if s.backend == 'deepspeed' else ''}, {s.precision}, activation checkpointing "
            f"{'on' if s.activation_checkpointing else 'off'}, micro-batch {s.tokens} tokens, logprob chunk {s.logprob_chunk_size}, "
            f"reference {s.reference}\n"
        )
        unit = "GPU" if s.device == "cuda" else "rank (process)"
        rows = [f"  {k:<14} {v / GiB:8.2f} GiB" for k, v in self.per_rank.items() if k in STEADY]
        for phase, keys in PHASES.items():
            if any(k in self.per_rank for k in keys):
                rows.append(f"  + {phase} phase: " + ", ".join(f"{k} {self.per_rank[k] / GiB:.2f}" for k in keys if k in self.per_rank)
                            + f" = {sum(self.per_rank.get(k, 0) for k in keys) / GiB:.2f} GiB")
        cap = f" of {s.device_bytes / GiB:.1f} GiB (usable {(1 - s.margin) * s.device_bytes / GiB:.1f} GiB with a {s.margin:.0%} margin)" if s.device_bytes else ""
        out = head + f"peak per {unit} (rank 0), held throughout + the largest phase:\n" + "\n".join(rows) + f"\n  {'peak':<14} {self.rank_total / GiB:8.2f} GiB{cap}\n"
        hrows = [f"  {k:<14} {v / GiB:8.2f} GiB" for k, v in self.per_host.items()]
        hcap = f" of {s.host_bytes / GiB:.1f} GiB" if s.host_bytes else ""
        out += "peak per host (learner pod):\n" + "\n".join(hrows) + f"\n  {'total':<14} {self.host_total / GiB:8.2f} GiB{hcap}\n"
        out += ("fits\n" if self.fits else "does not fit:\n" + "\n".join(f"  - {p}" for p in self.problems) + "\n")
        return out


def activation_bytes_per_token_layer(model: ModelShape, precision: str) -> float:
    a_h, a_i = ACTIVATION_BYTES[precision]
    return a_h * model.hidden_size + a_i * model.intermediate_size


STEADY = ("runtime", "weights", "gradients", "optimizer", "zero_buffers", "reference", "stream_buffers")
"""Components held through the whole step; the peak adds the largest of the phases' working sets."""
PHASES = {"train": ("gathered", "activations", "logits"), "step": ("optimizer_step",), "publish": ("publish",)}
"""Working sets of the step's phases: forward/backward, the optimizer step, publishing (rank 0)."""

ZERO_BUFFER_BYTES = {1: 2.75, 2: 2.75, 3: 8.5}
"""DeepSpeed's own flat buffers per element of a rank's partition beyond the states counted apart
(gradient staging, reduce and gather buffers), measured (benchmarks/learner_memory.py)."""



def peak_bytes(components: dict[str, int]) -> int:
    """The peak of a rank: what it holds throughout plus its largest phase."""
    steady = sum(v for k, v in components.items() if k in STEADY)
    return steady + max(sum(components.get(k, 0) for k in ks) for ks in PHASES.values())


def per_rank_components(model: ModelShape, s: LearnerShape, rank0: bool = True) -> dict[str, int]:
    P, W, b = model.params, s.world, WEIGHT_BYTES[s.precision]
    ds = s.backend == "deepspeed"
    z = s.zero_stage if ds else 0
    part = P / W  # elements of one rank's partition
    c: dict[str, float] = {"runtime": GPU_RUNTIME_BYTES if s.device == "cuda" else CPU_RUNTIME_BYTES}
    c["weights"] = P * b / (W if z == 3 else 1)
    if not ds:
        c["gradients"] = P * b
        c["optimizer"] = P * (8 if s.precision == "fp32" else 12)
    else:
        c["gradients"] = P * b if z <= 1 else part * b + ZERO_BUCKET_ELEMENTS * b
        c["optimizer"] = 12 * part
        c["zero_buffers"] = ZERO_BUFFER_BYTES[z] * part
    if s.stream_buffers and not ds:
        c["stream_buffers"] = s.stream_buffers * P * 4
    if s.reference == "initial":
        c["reference"] = P * b / (W if z == 3 else 1)
    elif s.reference == "ema":
        c["reference"] = P * 4
    # forward/backward
    if z == 3:
        c["gathered"] = 2 * max(model.layer_params, model.embedding_params) * b
    n, L = s.tokens, model.num_layers
    a = activation_bytes_per_token_layer(model, s.precision)
    c["activations"] = n * L * model.hidden_size * b + CHECKPOINT_RECOMPUTE * n * a if s.activation_checkpointing else n * L * a
    c["logits"] = LOGIT_BUFFERS[s.precision] * min(s.logprob_chunk_size, n) * model.vocab_size * 4 + model.embedding_params * 4
    # the optimizer step: DeepSpeed's float32 copy of the gradient partition it steps and AdamW's two
    # temporaries (sqrt(v), its quotient) over what it steps at once: the whole partition
    # (ZeRO-1/2), a sub-group (ZeRO-3); the torch backend steps one parameter at a time (and in
    # bf16 first converts every gradient to float32 for the masters)
    if ds:
        c["optimizer_step"] = 12 * (part if z in (1, 2) else min(part, SUB_GROUP_ELEMENTS))
    else:
        c["optimizer_step"] = 8 * max(model.embedding_params, model.layer_params // 4) + (4 * P if s.precision == "bf16" else 0)
    if rank0:  # one gathered bucket on the device (a tensor larger than the bucket is one alone)
        c["publish"] = min(max(s.publish_bucket_bytes, max(model.embedding_params, model.layer_params // 4) * b), P * b)
    return {k: int(v) for k, v in c.items()}


def per_host_components(model: ModelShape, s: LearnerShape, rank_bytes: dict[str, int]) -> dict[str, int]:
    ranks = max(1, s.gpus)
    if s.device == "cpu":  # everything is host memory: rank 0's peak + the others'
        others = peak_bytes({k: v for k, v in rank_bytes.items() if k != "publish"})
        return {"ranks": peak_bytes(rank_bytes) + (ranks - 1) * others}
    b = WEIGHT_BYTES[s.precision]
    largest = max(model.layer_params // 4, model.embedding_params) * 4  # one tensor read at a time, float32 at worst
    out = {
        "runtime": ranks * GPU_HOST_RUNTIME_BYTES,
        "load": ranks * largest,
        "publish": min(max(s.publish_bucket_bytes, model.embedding_params * b), model.params * b),  # rank 0's host copy of a bucket
    }
    if s.host_weight_copy:
        out["snapshot"] = model.params * b
    return out


def plan(model: ModelShape, shape: LearnerShape) -> MemoryPlan:
    """The peak memory of rank 0 (the largest: it also holds the publish bucket) and of a learner
    pod, and what to change when it does not fit."""
    if shape.backend == "torch" and shape.world > 1:
        raise ValueError("the torch backend trains on one process: use backend deepspeed for several ranks")
    per_rank = per_rank_components(model, shape)
    per_host = per_host_components(model, shape, per_rank)
    p = MemoryPlan(model, shape, per_rank, per_host)
    if shape.device_bytes:
        usable = (1 - shape.margin) * shape.device_bytes
        if p.rank_total > usable:
            p.problems.append(f"rank 0 needs {p.rank_total / GiB:.1f} GiB, over the {usable / GiB:.1f} GiB usable of a {shape.device_bytes / GiB:.1f} GiB GPU: " + advice(model, shape, per_rank, usable))
    if shape.host_bytes and p.host_total > shape.host_bytes:
        p.problems.append(
            f"a learner pod needs {p.host_total / GiB:.2f} GiB of host memory, over its {shape.host_bytes / GiB:.2f} GiB limit: "
            "raise learner.resources.limits.memory (learner.memoryPerRank) or run fewer ranks per pod"
        )
    return p


def advice(model: ModelShape, s: LearnerShape, c: dict[str, int], usable: float) -> str:
    """The knob to turn, largest saving first."""
    tips = []
    static = c["weights"] + c["gradients"] + c["optimizer"] + c.get("reference", 0)
    dynamic = c["activations"] + c["logits"]
    if s.precision == "fp32":
        tips.append("train in bf16 (learner.precision: bf16, MAGIC_PRECISION=bf16): halves weights, gradients and activations")
    if dynamic > static / 2 or not tips:
        if not s.activation_checkpointing:
            tips.append("turn on activation checkpointing (learner.activationCheckpointing: true, MAGIC_ACTIVATION_CHECKPOINTING=true)")
        if s.micro_batch_tokens > s.sequence_tokens:
            tips.append(f"lower the micro-batch token budget toward prompt + T = {s.sequence_tokens} (learner.microBatchTokens, MAGIC_MICRO_BATCH_TOKENS)")
        elif s.activation_checkpointing:
            tips.append(f"a sequence of prompt + T = {s.sequence_tokens} tokens is one micro-batch (sequences are not split): lower T or the prompt length")
        if c["logits"] > 0.1 * usable and s.logprob_chunk_size > 256:
            tips.append("lower the log-prob chunk (MAGIC_LOGPROB_CHUNK_SIZE)")
    if s.backend == "deepspeed" and s.zero_stage < 3:
        tips.append("partition the weights too (learner.zeroStage: 3)")
    if s.backend == "torch":
        tips.append("train on several GPUs with DeepSpeed ZeRO (learner.gpus > 1)")
    else:
        need = needed_nodes(model, s, usable)
        if need and need[0] > s.nodes:
            tips.append(f"more ranks: learner.nodes {need[0]} (now {s.nodes}) fits{'' if need[1] == s.zero_stage else f' with ZeRO-{need[1]}'}")
    if s.reference == "ema":
        tips.append("the EMA reference is a float32 replica on every rank: use kl_reference initial or beta 0")
    return "; ".join(tips) or "no knob of the learner is enough: a larger GPU is needed"


def needed_nodes(model: ModelShape, s: LearnerShape, usable: float, limit: int = 64) -> tuple[int, int] | None:
    """(nodes, ZeRO stage): the fewest nodes (same GPUs per node; the shape's stage, else ZeRO-3)
    at which rank 0 fits, or None up to `limit` nodes."""
    for nodes in range(s.nodes, limit + 1):
        for stage in sorted({s.zero_stage, 3}):
            trial = replace(s, nodes=nodes, zero_stage=stage)
            if peak_bytes(per_rank_components(model, trial)) <= usable:
                return nodes, stage
    return None


def parse_bytes(text: str | int | float, unit_required: bool = False) -> int:
    """"80GB", "80Gi", "128Gi", "1Ti", "512M", 8e10 -> bytes (Kubernetes quantities and plain
    numbers; `unit_required`: a bare number is refused, "80" is not 80 GB)."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r}: not a memory size (e.g. 80GB, 80Gi, 1Ti)")
    if isinstance(text, (int, float)) and not unit_required:
        return int(text)
    t = str(text).strip()
    units = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
             "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
    num = t.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    unit = t[len(num):]
    if unit not in units or not num or (unit_required and not unit):
        raise ValueError(f"{text!r}: not a memory size with a unit (e.g. 80GB, 80Gi, 1Ti)" if unit_required else f"{text!r}: not a memory size (e.g. 80GB, 80Gi, 1Ti)")
    value = float(num) * units[unit]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r}: not a positive memory size")
    return int(value)


def _int(learner: dict, key: str, default: int, low: int, high: int | None = None) -> int:
    value = learner.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bounds = f"an integer from {low} to {high}" if high is not None else f"an integer of at least {low}"
        raise ValueError(f"learner.{key}: {value!r} is not {bounds}")
    return value


def shape_from_values(values: dict, sequence_tokens: int, reference: str = "none") -> LearnerShape:
    """The learner's shape as the chart renders it from its values (`learner.*`; unset keys take
    the chart's defaults): ranks, ZeRO stage, precision ("auto": bf16 on GPUs, fp32 on CPU),
    checkpointing, micro-batch budget, the GPU's memory (`learner.gpuMemory`, with a unit) and the
    pod's memory limit (`learner.resources.limits.memory`, else `learner.memoryPerRank.limitGi` ×
    ranks), and on one rank (the torch backend, streaming on: the learner's default) the gradient
    buffers of the recipe's streamed step (`RECIPE_STREAM_BUFFERS`). Raises ValueError naming the
    value that is not what the chart accepts."""
    if not isinstance(values, dict):
        raise ValueError("the values are not a mapping")
    learner = values.get("learner") or {}
    if not isinstance(learner, dict):
        raise ValueError(f"learner: {learner!r} is not a mapping of the learner's values")
    gpus = _int(learner, "gpus", 1, 0)
    nodes = _int(learner, "nodes", 1, 1)
    zero_stage = _int(learner, "zeroStage", 2, 1, 3)
    micro = _int(learner, "microBatchTokens", 16384, 64)
    ranks = max(1, gpus) * nodes
    precision = learner.get("precision", "auto") or "auto"
    if precision == "auto":
        precision = "bf16" if gpus > 0 else "fp32"
    if precision not in WEIGHT_BYTES:
        raise ValueError(f"learner.precision: {precision!r} is not auto, bf16 or fp32")
    checkpointing = learner.get("activationCheckpointing", False)
    if not isinstance(checkpointing, bool):
        raise ValueError(f"learner.activationCheckpointing: {checkpointing!r} is not true or false")
    resources = learner.get("resources") or {}
    limits = (resources.get("limits") or {}) if isinstance(resources, dict) else None
    if not isinstance(limits, dict):
        raise ValueError(f"learner.resources: {resources!r} is not a Kubernetes resources mapping")
    per_rank = learner.get("memoryPerRank") or {}
    if not isinstance(per_rank, dict):
        raise ValueError(f"learner.memoryPerRank: {per_rank!r} is not a mapping")
    if limits.get("memory"):
        host = parse_bytes(limits["memory"])
    else:
        host = _int({"limitGi": per_rank.get("limitGi", CHART_MEMORY_PER_RANK_LIMIT_GI)}, "limitGi", 0, 1) * max(1, gpus) * GiB
    gpu_memory = learner.get("gpuMemory", "80GB")
    transport = values.get("weightTransportOptions") or {}
    return LearnerShape(
        gpus=max(1, gpus),
        nodes=nodes,
        backend="deepspeed" if ranks > 1 else "torch",
        stream_buffers=0 if ranks > 1 else RECIPE_STREAM_BUFFERS,
        zero_stage=zero_stage,
        precision=precision,
        activation_checkpointing=checkpointing,
        micro_batch_tokens=micro,
        sequence_tokens=sequence_tokens,
        reference=reference,  # type: ignore[arg-type]
        device="cuda" if gpus > 0 else "cpu",
        device_bytes=parse_bytes(gpu_memory, unit_required=True) if gpus > 0 else None,
        host_bytes=host,
        host_weight_copy=values.get("weightTransport") == "nccl" and (not isinstance(transport, dict) or transport.get("snapshot", True) is not False),
    )


RECIPE_STREAM_BUFFERS = 2
"""A streamed step of the recipe's stages (N_SGD = 1, GRPO, adaptive entropy control, no KL) holds two
gradient buffers: the policy gradient's and the entropy bonus's (`stream_buffer_count`)."""


def stream_buffer_count(stage, settings) -> int:
    """Policy-sized gradient buffers a streamed step of `stage` holds on this learner: one per loss
    term accumulated apart (`magic.learner.streaming`: the policy gradient; the batch estimator's
    mean term; the entropy bonus when it may count; beta's KL), none where nothing is backpropagated
    before the last group (streaming off, DeepSpeed or several ranks, N_SGD > 1 under a mini-batch
    rule other than "slot", the batch estimator with Adv-Mask-After)."""
    if not getattr(settings, "stream", False) or settings.backend != "torch" or max(1, settings.world_size) > 1:
        return 0
    batch = stage.advantage_estimator.value == "batch"
    if (stage.n_sgd > 1 and stage.minibatch_rule != "slot") or (batch and stage.advantage_mask.value == "after"):
        return 0
    return 1 + int(batch) + int(bool(stage.entropy.adaptive or stage.entropy.coef)) + int(stage.kl_coef > 0)


def learner_shape(settings, sequence_tokens: int, reference: str, device_bytes: int | None, host_bytes: int | None, stream_buffers: int = 0) -> LearnerShape:
    """The shape of this learner job from its `LearnerSettings` (world size, ZeRO stage, precision...)."""
    local = max(1, getattr(settings, "local_world_size", 1) or 1)
    world = max(1, settings.world_size)
    return LearnerShape(
        gpus=min(local, world),
        nodes=max(1, -(-world // local)),
        backend=settings.backend,
        zero_stage=settings.zero_stage,
        precision=settings.precision,
        activation_checkpointing=settings.activation_checkpointing,
        micro_batch_tokens=settings.micro_batch_tokens,
        sequence_tokens=sequence_tokens,
        logprob_chunk_size=settings.logprob_chunk_size,
        reference=reference,  # type: ignore[arg-type]
        device="cuda" if str(settings.device).startswith("cuda") else "cpu",
        device_bytes=device_bytes,
        host_bytes=host_bytes,
        host_weight_copy=getattr(settings.weight_transport, "type", "") == "nccl" and bool(getattr(settings.weight_transport, "snapshot", False)),
        stream_buffers=stream_buffers,
    )


def stage_problems(model: ModelShape, stage, settings, device_bytes: int | None, host_bytes: int | None) -> list[str]:
    """Why `stage` (a StageConfig) does not fit this learner, or []: its T plus the longest prompt
    the plan assumes (`max_prompt_tokens`), its KL reference, the gradient buffers of its streamed steps."""
    reference = stage.kl_reference if stage.kl_coef > 0 else "none"
    shape = learner_shape(settings, settings.max_prompt_tokens + stage.context_length, reference, device_bytes, host_bytes, stream_buffer_count(stage, settings))
    if shape.backend == "torch" and shape.world > 1:
        return []
    return [f"stage {stage.name!r} (T = {stage.context_length}): {p}" for p in plan(model, shape).problems]


def host_memory_limit() -> int | None:
    """This container's memory limit (cgroup v2 memory.max, v1 limit_in_bytes), None if unlimited."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:
            return int(text)
        return None
    return None
