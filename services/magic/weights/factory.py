"""Build the sender or receiver named by a weight-transport config's `type`."""

from __future__ import annotations

from pathlib import Path

from magic.store.channels import RunChannels
from magic.weights.base import WeightReceiver, WeightSender
from magic.weights.config import FilesystemTransportConfig, HttpTransportConfig, NcclTransportConfig, WeightTransport
from magic.weights.filesystem import FilesystemReceiver, FilesystemSender, FilesystemWeightStore
from magic.weights.http import HttpReceiver, HttpSender
from magic.weights.nccl import NcclReceiver, NcclSender


def make_sender(config: WeightTransport, *, channels: RunChannels, root: Path, config_json: str, keep: int) -> WeightSender:
    """The learner's sender for the run of `channels`: versions live under `root`, announcements
    go to the run's `weights` stream, written under the learner's lease (its epoch names them)."""
    store = FilesystemWeightStore(root, epoch=channels.fence.epoch if channels.fence is not None else 0)
    run_id, stream = channels.run_id, channels.stream("weights")
    if isinstance(config, FilesystemTransportConfig):
        return FilesystemSender(run_id, store, stream, config_json, keep)
    if isinstance(config, HttpTransportConfig):
        return HttpSender(run_id, store, stream, config_json, keep, config)
    if isinstance(config, NcclTransportConfig):
        return NcclSender(channels, store, config_json, keep, config)
    raise ValueError(f"unknown weight transport {config!r}")


def make_receiver(config: WeightTransport, *, worker_name: str, cache_dir: Path) -> WeightReceiver:
    """A rollout worker's receiver; `cache_dir` holds downloads (transport `http`)."""
    if isinstance(config, FilesystemTransportConfig):
        return FilesystemReceiver(config)
    if isinstance(config, HttpTransportConfig):
        return HttpReceiver(config, config.cache_dir or cache_dir)
    if isinstance(config, NcclTransportConfig):
        return NcclReceiver(config, worker_name)
    raise ValueError(f"unknown weight transport {config!r}")
