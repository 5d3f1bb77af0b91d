"""The sender / receiver interface every weight transport implements."""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Union

import torch

from magic.protocol.pb import messages_pb2 as pb


class WeightIntegrityError(RuntimeError):
    """A published weight version is incomplete, corrupt, or not the one announced."""


@dataclass(frozen=True)
class Checkpoint:
    """A verified Hugging Face checkpoint directory (config.json + model.safetensors) of one version."""

    version: int
    directory: Path


@dataclass
class StateBuckets:
    """Published weights that arrive bucket by bucket: the learner gathers one bucket of its
    (ZeRO-3-partitioned) parameters at a time while the sender writes or sends it, so rank 0
    never holds the whole model (`Backend.state_dict_buckets`). `layout` (name, dtype, shape)
    is known before any bucket; the buckets come in its order and may be iterated once."""

    layout: list[tuple[str, torch.dtype, tuple[int, ...]]]
    buckets: Iterable[Mapping[str, torch.Tensor]]

    @classmethod
    def of(cls, state: "WeightState") -> "StateBuckets":
        """`state` as buckets (a whole state dict: one bucket)."""
        if isinstance(state, StateBuckets):
            return state
        return cls([(k, v.dtype, tuple(v.shape)) for k, v in state.items()], [state])

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) in layout order, checked against the layout."""
        expected = iter(self.layout)
        for bucket in self.buckets:
            for name, tensor in bucket.items():
                want = next(expected, None)
                if want is None or want[0] != name or want[1] != tensor.dtype or want[2] != tuple(tensor.shape):
                    raise ValueError(f"published weights: got {name} {tensor.dtype} {tuple(tensor.shape)}, the layout expects {want}")
                yield name, tensor
        missing = [n for n, _, _ in expected]
        if missing:
            raise ValueError(f"published weights: the buckets ended before {missing[:3]}")


WeightState = Union[Mapping[str, torch.Tensor], StateBuckets]
"""What `WeightSender.publish` takes: a whole state dict, or the weights bucket by bucket."""


class CheckpointLoader(Protocol):
    """What a receiver needs from an engine (every `RolloutEngine` has it)."""

    def load_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Serve `checkpoint.version` from now on, with the weights in `checkpoint.directory`."""


class WeightSender(abc.ABC):
    """Learner side: make version k reachable by every rollout worker, then announce it."""

    @abc.abstractmethod
    def publish(self, version: int, state_dict: WeightState) -> pb.WeightUpdate:
        """Send `state_dict` (a state dict, or `StateBuckets`) as policy version `version`; returns
        the announcement (already on `weights`)."""

    @abc.abstractmethod
    def load_version(self, version: int) -> dict[str, torch.Tensor]:
        """The state dict of a version this sender published earlier (the learner resumes from it)."""

    def close(self) -> None:
        """Release servers, threads and process groups."""


class WeightReceiver(abc.ABC):
    """Rollout side: turn a WeightUpdate into weights the engine serves."""

    @abc.abstractmethod
    def receive(self, update: pb.WeightUpdate, engine: CheckpointLoader) -> None:
        """Have `engine` serve `update.version`; raises WeightIntegrityError when the version is
        incomplete or corrupt (the engine keeps its previous weights then)."""

    def receive_batch(self, updates: list[pb.WeightUpdate], engine) -> None:
        """Apply what a batch of announcements (in stream order) asks of this worker: by default
        only the newest version, if it is newer than the engine's (a catching-up worker skips the
        versions in between, which may already be garbage-collected)."""
        newest = max(updates, key=lambda u: u.version, default=None)
        if newest is not None and newest.version > engine.version:
            self.receive(newest, engine)

    def endpoint_status(self, engine) -> dict:
        """Fields this worker's heartbeat advertises to the sender (the NCCL endpoint); none by default."""
        return {}

    def close(self) -> None:
        """Release what the receiver holds."""
