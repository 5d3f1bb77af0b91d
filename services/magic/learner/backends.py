"""Where the policy's parameters and optimizer live: one torch process, or DeepSpeed ZeRO over ranks.

A backend owns the model and the optimizer and offers what the trainer needs, the same way on
one process or many:

    forward(input_ids, attention_mask, tau)  -> logp, entropy    (per-token, chunked over the vocab)
    backward(loss)       the loss is this rank's token *sum* / the global token count; the backend
                         makes the summed gradient over ranks equal to a single process's
    step(lr, max_norm)   clip to the global grad norm, update, zero the gradients -> grad norm
    all_reduce_sum(t)    sums a tensor over ranks (entropy, token counts, metric sums)
    full_state_dict()    the full weights on rank 0 (gathered from ZeRO-3 partitions); collective
    save(dir)/load(dir)  optimizer state (and DeepSpeed's partitioned state) for checkpoints

Backends are chosen by `LearnerSettings.backend`: "torch" (CPU or one GPU) or "deepspeed"
(ZeRO stage `LearnerSettings.zero_stage`, one process per rank, started by `deepspeed`,
`torchrun` or any launcher that sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT).

Precision (`LearnerSettings.precision`): "fp32", or "bf16" — mixed precision as in
Micikevicius et al. 2018 with bfloat16 (no loss scaling needed): the model's weights,
activations and gradients are bfloat16, the optimizer holds float32 master weights and Adam
moments, each step converts the gradients to float32, clips and updates the masters, and copies
them back (rounded) into the bfloat16 weights. The torch backend keeps the masters itself
(`MasterWeights`); DeepSpeed's `bf16` mode keeps them in its ZeRO partitions. Log-probs, entropy
and the loss are float32 (`modeling.ChunkedLogpEntropy` upcasts each chunk's logits).
"""

from __future__ import annotations

import abc
import datetime
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from magic import modeling
from magic.config.schema import OptimConfig
from magic.learner import loading
from magic.learner.memory import PUBLISH_BUCKET_BYTES, SUB_GROUP_ELEMENTS, ZERO_BUCKET_ELEMENTS

log = logging.getLogger(__name__)


class PolicyForward(torch.nn.Module):
    """The policy's per-token log-probs and entropy as one module call (DeepSpeed's engine wraps it)."""

    def __init__(self, policy: torch.nn.Module, chunk_size: int):
        super().__init__()
        self.policy = policy
        self.chunk_size = chunk_size

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float):
        return modeling.token_logprobs(self.policy, input_ids, attention_mask, temperature, chunk_size=self.chunk_size)


class Backend(abc.ABC):
    rank: int = 0
    world_size: int = 1

    def __init__(self, policy: torch.nn.Module, device: torch.device):
        self.policy = policy
        self.device = device

    @abc.abstractmethod
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]: ...

    @abc.abstractmethod
    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """Accumulate the gradient of `loss`; `last` marks the last micro-batch before `step`."""

    @abc.abstractmethod
    def step(self, lr: float, max_grad_norm: float) -> float:
        """One optimizer step on the accumulated gradients; returns the global grad norm before clipping."""

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def broadcast_object(self, obj=None):
        """Rank 0's `obj` on every rank."""
        return obj

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The full weights (tied output embeddings once) on rank 0, None elsewhere. Collective."""
        return modeling.export_state_dict(self.policy)

    def state_dict_buckets(self, bucket_bytes: int, dtype: torch.dtype | None = None) -> Iterator[dict[str, torch.Tensor] | None]:
        """The full weights as consecutive buckets of at most `bucket_bytes` (a larger tensor is a
        bucket of its own), in state-dict order, cast to `dtype`: dicts on rank 0, None on the
        others. Collective: every rank iterates to the end. Beyond the weights a rank already
        holds, one bucket exists at a time (ZeRO-3 gathers one bucket's parameters at a time)."""
        layout = self._state_layout()
        state = dict(layout)
        for names in _bucket_names(layout, bucket_bytes, dtype):
            yield self._gather_bucket(names, state, dtype)

    def published_layout(self, dtype: torch.dtype | None = None) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        """(name, dtype, shape) of what `state_dict_buckets(…, dtype)` yields, in order, without gathering."""
        out = []
        for name, t in self._state_layout():
            shape = tuple(getattr(t, "ds_shape", None) or t.shape)
            out.append((name, dtype if dtype is not None and t.is_floating_point() else t.dtype, shape))
        return out

    def _state_layout(self) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor) of the published state dict, in order (tied output embeddings once)."""
        return list(self.full_state_dict().items())

    def _gather_bucket(self, names: list[str], state: dict, dtype: torch.dtype | None) -> dict[str, torch.Tensor] | None:
        return {n: _cast_copy(state[n], dtype) for n in names}

    @torch.no_grad()
    def update_ema(self, reference: torch.nn.Module, decay: float) -> None:
        """reference <- decay * reference + (1 - decay) * policy, parameter by parameter, from the
        policy's float32 master weights where there are some (decay 0 copies the policy)."""
        ref = dict(reference.named_parameters())
        for name, value in self._named_training_weights():
            ref[name].lerp_(value.to(ref[name].dtype), 1.0 - decay)

    def _named_training_weights(self):
        """(name, tensor) of the full trainable weights, the most precise copy this rank holds."""
        return ((n, p.detach()) for n, p in self.policy.named_parameters() if p.requires_grad)

    @abc.abstractmethod
    def save(self, directory: Path) -> None:
        """Optimizer state into `directory` (collective)."""

    def capture_optimizer(self) -> Callable[[Path], None] | None:
        """A copy of the optimizer state in CPU memory, as a function writing it into a checkpoint
        directory later (from another thread); None when the state can only be written now,
        collectively, by `save`."""
        return None

    @abc.abstractmethod
    def load(self, directory: Path) -> None:
        """Optimizer state (and for DeepSpeed the partitioned weights) from `directory` (collective)."""

    def train(self, mode: bool = True) -> None:
        self.policy.train(mode)

    # -- the reference policy pi_ref of kl_reference "initial" (§3.2.6) --------------------------

    reference_is_collective: bool = False
    """Whether every rank must run `reference_forward` for every micro-batch (ZeRO-3 gathers)."""
    chunk_size: int = 1024

    model_dir: str | Path | None = None
    """The run's initial model (the reference policy of kl_reference "initial")."""

    def load_reference(self, fallback: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        """The run's initial model as pi_ref, in the policy's compute dtype (bf16 halves its
        memory), no gradients: read from `model_dir` tensor by tensor in that dtype
        (`loading.load_dense`), or, without one, `fallback` (float32) cast down."""
        dtype = next(self.policy.parameters()).dtype
        if self.model_dir is not None:
            return loading.load_dense(self.model_dir, self.device, dtype).requires_grad_(False)
        return fallback().to(dtype).requires_grad_(False)

    def reference_forward(self, ref, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float) -> torch.Tensor:
        """log pi_ref of the micro-batch's tokens."""
        return modeling.token_logprobs(ref, input_ids, attention_mask, temperature, chunk_size=self.chunk_size)[0]


PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
"""Compute dtype of the model for each `LearnerSettings.precision`."""


def prepare_policy(policy: torch.nn.Module, activation_checkpointing: bool) -> torch.nn.Module:
    """Turn on activation checkpointing (Chen et al. 2016) in the Hugging Face model: each decoder
    layer's activations are recomputed in the backward pass (non-reentrant `torch.utils.checkpoint`)."""
    if activation_checkpointing:
        policy.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return policy


class MasterWeights:
    """float32 master copies of a low-precision model's trainable parameters (mixed precision).

    `step` moves the model's (bfloat16) gradients onto the masters in float32, clips them to the
    global norm, runs the optimizer on the masters and writes them back into the model's weights
    (round to nearest). The optimizer and its state only ever see float32.
    """

    def __init__(self, named: list[tuple[str, torch.nn.Parameter]]):
        self.names = [n for n, _ in named]
        self.model_params = [p for _, p in named]
        self.masters = [torch.nn.Parameter(p.detach().to(torch.float32).clone()) for p in self.model_params]

    def grads_to_masters(self) -> None:
        for p, m in zip(self.model_params, self.masters):
            m.grad = None if p.grad is None else p.grad.to(torch.float32)
            p.grad = None

    @torch.no_grad()
    def masters_to_model(self) -> None:
        for p, m in zip(self.model_params, self.masters):
            p.copy_(m)

    def state(self) -> dict[str, torch.Tensor]:
        return {n: m.detach() for n, m in zip(self.names, self.masters)}


class TorchBackend(Backend):
    """One process, plain torch AdamW (CPU, or one GPU); with precision "bf16" the model is cast
    to bfloat16 and AdamW updates float32 master weights (`MasterWeights`)."""

    def __init__(
        self,
        policy: torch.nn.Module,
        optim: OptimConfig,
        device: torch.device,
        chunk_size: int = 1024,
        precision: str = "fp32",
        activation_checkpointing: bool = False,
        model_dir: str | Path | None = None,
    ):
        super().__init__(policy, device)
        self.model_dir = model_dir
        named = [(n, p) for n, p in policy.named_parameters() if p.requires_grad]
        self.master = None
        if precision != "fp32":
            self.master = MasterWeights(named)  # from the loaded float32 weights, before rounding
            policy.to(PRECISION_DTYPES[precision])
            self.master.model_params = [p for n, p in policy.named_parameters() if p.requires_grad]
        prepare_policy(policy, activation_checkpointing)
        self.chunk_size = chunk_size
        self.module = PolicyForward(policy, chunk_size)
        params = self.master.masters if self.master else [p for _, p in named]
        self.optimizer = torch.optim.AdamW(params, lr=1e-6, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay)

    def forward(self, input_ids, attention_mask, temperature):
        return self.module(input_ids, attention_mask, temperature)

    def backward(self, loss, last):
        loss.backward()

    def step(self, lr, max_grad_norm):
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        if self.master is not None:
            self.master.grads_to_masters()
            params = self.master.masters
        else:
            params = list(self.policy.parameters())
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm).item()
        if norm == norm and norm != float("inf"):  # a non-finite gradient skips the update
            self.optimizer.step()
            if self.master is not None:
                self.master.masters_to_model()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def _named_training_weights(self):
        if self.master is None:
            return super()._named_training_weights()
        return self.master.state().items()

    def full_state_dict(self):
        """The float32 master weights in bf16 mode (what checkpoints keep), else the model's."""
        state = modeling.export_state_dict(self.policy)
        if self.master is not None:
            masters = self.master.state()
            state = {k: masters.get(k, v.to(torch.float32) if v.is_floating_point() else v) for k, v in state.items()}
        return state

    def save(self, directory):
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")

    def capture_optimizer(self):
        state = _to_cpu(self.optimizer.state_dict())
        return lambda directory: torch.save(state, directory / "optimizer.pt")

    def load(self, directory):
        self.optimizer.load_state_dict(torch.load(directory / "optimizer.pt", map_location=self.device, weights_only=True))


def _cast_copy(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """A host copy of `t` in `dtype` (floating point only): the bucket rank 0 hands to the transport
    or the checkpoint costs the device nothing beyond the gathered parameters themselves."""
    t = t.detach()
    target = dtype if dtype is not None and t.is_floating_point() else t.dtype
    return t.to("cpu", target, copy=True)


def _bucket_names(layout: list[tuple[str, object]], bucket_bytes: int, dtype: torch.dtype | None) -> list[list[str]]:
    """Names of `layout` ((name, tensor or parameter)) grouped in order into buckets of at most
    `bucket_bytes` in `dtype` (a larger tensor alone)."""
    buckets: list[list[str]] = [[]]
    size = 0
    for name, t in layout:
        numel = getattr(t, "ds_numel", None) or t.numel()
        item = (torch.empty((), dtype=dtype).element_size() if dtype is not None and t.is_floating_point() else t.element_size())
        n = numel * item
        if buckets[-1] and size + n > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(name)
        size += n
    return [b for b in buckets if b]


def _to_cpu(obj):
    """A deep copy of a (nested) state dict with every tensor copied to CPU memory."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def init_distributed(device: torch.device, timeout_seconds: float) -> tuple[int, int]:
    """Join the process group described by RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (gloo on
    CPU, nccl on GPU); returns (rank, world_size)."""
    import deepspeed

    if not torch.distributed.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cpu":
            # DeepSpeed JIT-compiles a shared-memory all-reduce kernel for CPU ranks on first use
            # (minutes, with a compiler); gloo's own all-reduce is enough for CPU runs.
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend=backend, timeout=datetime.timedelta(seconds=timeout_seconds))
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def deepspeed_config(zero_stage: int, precision: str, max_grad_norm: float | None, load_universal: bool = False) -> dict:
    """The DeepSpeed config of the learner (and of `deepspeed.zero.Init`, which must partition like
    the engine); `max_grad_norm` None: an inference engine (the ZeRO-3 reference policy)."""
    zero = {"stage": zero_stage, "reduce_bucket_size": ZERO_BUCKET_ELEMENTS, "allgather_bucket_size": ZERO_BUCKET_ELEMENTS}
    if zero_stage == 3:  # gathered parameters bounded by the bucket: DeepSpeed's defaults keep up to 1e9 elements (2 GB in bf16) alive
        zero.update(
            stage3_prefetch_bucket_size=ZERO_BUCKET_ELEMENTS,
            stage3_max_live_parameters=2 * ZERO_BUCKET_ELEMENTS,
            stage3_max_reuse_distance=ZERO_BUCKET_ELEMENTS,
            # the optimizer steps the partition in sub-groups of this many elements: its float32
            # gradient copy and AdamW's temporaries exist for one sub-group at a time (default 1e9)
            sub_group_size=SUB_GROUP_ELEMENTS,
        )
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": precision == "bf16"},  # bfloat16 model, float32 master weights in the ZeRO optimizer
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }
    if max_grad_norm is not None:
        config["gradient_clipping"] = max_grad_norm
    if load_universal:  # the checkpoint to load was written at another shape, converted (checkpoints.to_universal)
        config["checkpoint"] = {"load_universal": True}
    return config


class DeepSpeedBackend(Backend):
    """DeepSpeed ZeRO (stage 1, 2 or 3) over the ranks of the default process group.

    The optimizer is torch's AdamW handed to DeepSpeed (a "client optimizer"), so CPU runs need
    no compiled DeepSpeed ops (set DS_ACCELERATOR=cpu there). DeepSpeed *averages* gradients over
    ranks; each rank's loss is its token sum divided by the global token count, so the loss is
    multiplied by the world size before `backward` to make the result the single-process gradient.
    Gradient accumulation boundaries are set by the trainer (micro-batch counts vary per step).
    """

    def __init__(
        self,
        policy: torch.nn.Module,
        optim: OptimConfig,
        device: torch.device,
        zero_stage: int,
        chunk_size: int = 1024,
        precision: str = "fp32",
        activation_checkpointing: bool = False,
        model_dir: str | Path | None = None,
        load_universal: bool = False,
    ):
        """`policy` as `load_policy` builds it (partitioned from construction under ZeRO-3);
        `model_dir`: the run's initial model, the reference policy of kl_reference "initial"."""
        import deepspeed

        super().__init__(policy, device)
        prepare_policy(policy, activation_checkpointing)
        self.rank, self.world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        self.zero_stage = zero_stage
        self.precision = precision
        self.chunk_size = chunk_size
        self.model_dir = model_dir
        optimizer = torch.optim.AdamW(
            [p for p in policy.parameters() if p.requires_grad], lr=1e-6, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay
        )
        config = deepspeed_config(zero_stage, precision, optim.max_grad_norm, load_universal)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=PolicyForward(policy, chunk_size), optimizer=optimizer, config=config)
        self.max_grad_norm = optim.max_grad_norm

    @classmethod
    def load_policy(cls, model_dir: str | Path, device: torch.device, zero_stage: int, precision: str) -> torch.nn.Module:
        """The policy of `model_dir` as this backend trains it, never whole in float32 first
        (`magic.learner.loading`): ZeRO-3 partitions it from construction and each rank reads its
        own share of the files; ZeRO-1/2 load the full replica in the training precision."""
        dtype = PRECISION_DTYPES[precision]
        if zero_stage == 3:
            return loading.build_partitioned(model_dir, deepspeed_config(3, precision, 1.0), dtype, device)
        return loading.load_dense(model_dir, device, dtype)

    @property
    def reference_is_collective(self) -> bool:
        return self.zero_stage == 3

    def load_reference(self, fallback: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        """Under ZeRO-3 the reference is partitioned like the policy (read from `model_dir`, its
        own share on each rank) and runs in a DeepSpeed engine of its own (no optimizer), which
        gathers one layer at a time; under ZeRO-1/2 it is a full replica in the compute dtype."""
        if self.zero_stage < 3:
            return super().load_reference(fallback)
        import deepspeed

        if self.model_dir is None:
            raise RuntimeError("the ZeRO-3 backend needs model_dir to load the reference policy partitioned")
        ref = self.load_policy(self.model_dir, self.device, 3, self.precision).requires_grad_(False)
        config = deepspeed_config(3, self.precision, None)
        engine, *_ = deepspeed.initialize(model=PolicyForward(ref, self.chunk_size), config=config)
        engine.eval()
        return engine

    def reference_forward(self, ref, input_ids, attention_mask, temperature):
        if self.zero_stage < 3:
            return super().reference_forward(ref, input_ids, attention_mask, temperature)
        return ref(input_ids, attention_mask, temperature)[0]

    def forward(self, input_ids, attention_mask, temperature):
        return self.engine(input_ids, attention_mask, temperature)

    def backward(self, loss, last):
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss * self.world_size)
        if not last:
            self.engine.step()  # DeepSpeed counts micro-steps; no update off the boundary

    def step(self, lr, max_grad_norm):
        if max_grad_norm != self.max_grad_norm:
            raise ValueError("the DeepSpeed backend clips at the max_grad_norm it was created with")
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.engine.set_gradient_accumulation_boundary(True)
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else 0.0

    def all_reduce_sum(self, t):
        t = t.clone()
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
        return t

    def all_reduce_max(self, t):
        t = t.clone()
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return t

    def broadcast_object(self, obj=None):
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def _state_layout(self):
        if self.zero_stage < 3:
            return list(modeling.export_state_dict(self.policy).items())
        state = dict(self.policy.state_dict(keep_vars=True))  # ZeRO-3: the partitioned parameters themselves
        if getattr(self.policy.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        return list(state.items())

    def _gather_bucket(self, names, state, dtype):
        if self.zero_stage < 3:
            return super()._gather_bucket(names, state, dtype) if self.rank == 0 else None
        import deepspeed

        params = [state[n] for n in names if hasattr(state[n], "ds_id")]
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            if self.rank != 0:
                return None
            return {n: _cast_copy(state[n], dtype) for n in names}

    def full_state_dict(self):
        """The whole model on rank 0 (host copies), None elsewhere: the buckets merged. For tests and
        small models — the learner itself only ever streams `state_dict_buckets`."""
        if self.zero_stage < 3:
            return modeling.export_state_dict(self.policy) if self.rank == 0 else None
        state: dict[str, torch.Tensor] = {}
        for bucket in self.state_dict_buckets(PUBLISH_BUCKET_BYTES):
            if bucket is not None:
                state.update(bucket)
        return state if self.rank == 0 else None

    def _named_training_weights(self):
        if self.zero_stage < 3:
            yield from super()._named_training_weights()
            return
        import deepspeed

        for name, p in self.policy.named_parameters():  # one partitioned parameter gathered at a time
            if p.requires_grad:
                with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
                    yield name, p.detach().clone()

    def save(self, directory):
        self.engine.save_checkpoint(str(directory), tag="deepspeed", save_latest=False)

    def load(self, directory):
        path, _ = self.engine.load_checkpoint(str(directory), tag="deepspeed", load_module_strict=True)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory}")

    def train(self, mode=True):
        self.engine.train(mode)
