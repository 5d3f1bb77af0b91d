"""The sender / receiver interface every weight transport implements."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from magic.protocol.pb import messages_pb2 as pb


class WeightIntegrityError(RuntimeError):
    """A published weight version is incomplete, corrupt, or not the one announced."""


@dataclass(frozen=True)
class Checkpoint:
    """A verified Hugging Face checkpoint directory (config.json + model.safetensors) of one version."""

    version: int
    directory: Path


class CheckpointLoader(Protocol):
    """What a receiver needs from an engine (every `RolloutEngine` has it)."""

    def load_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Serve `checkpoint.version` from now on, with the weights in `checkpoint.directory`."""


class WeightSender(abc.ABC):
    """Learner side: make version k reachable by every rollout worker, then announce it."""

    @abc.abstractmethod
    def publish(self, version: int, state_dict: dict[str, torch.Tensor]) -> pb.WeightUpdate:
        """Send `state_dict` as policy version `version`; returns the announcement (already on `weights`)."""

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
