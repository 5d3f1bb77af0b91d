"""Build the sender or receiver named by a weight-transport config's `type`."""

from __future__ import annotations

from pathlib import Path

import redis

from magic.common.bus import Stream
from magic.common.config import FilesystemTransportConfig, HttpTransportConfig, NcclTransportConfig, WeightTransport
from magic.common.weights.base import WeightReceiver, WeightSender
from magic.common.weights.filesystem import FilesystemReceiver, FilesystemSender, FilesystemWeightStore


def make_sender(
    config: WeightTransport, *, r: redis.Redis, run_id: str, root: Path, stream: Stream, config_json: str, keep: int
) -> WeightSender:
    """The learner's sender: versions live under `root`, announcements go to `stream`."""
    store = FilesystemWeightStore(root)
    if isinstance(config, FilesystemTransportConfig):
        return FilesystemSender(run_id, store, stream, config_json, keep)
    if isinstance(config, HttpTransportConfig):
        from magic.common.weights.http import HttpSender

        return HttpSender(run_id, store, stream, config_json, keep, config)
    if isinstance(config, NcclTransportConfig):
        from magic.common.weights.nccl import NcclSender

        return NcclSender(r, run_id, store, stream, config_json, keep, config)
    raise ValueError(f"unknown weight transport {config!r}")


def make_receiver(config: WeightTransport, *, worker_name: str, cache_dir: Path) -> WeightReceiver:
    """A rollout worker's receiver; `cache_dir` holds downloads (transport `http`)."""
    if isinstance(config, FilesystemTransportConfig):
        return FilesystemReceiver(config)
    if isinstance(config, HttpTransportConfig):
        from magic.common.weights.http import HttpReceiver

        return HttpReceiver(config, config.cache_dir or cache_dir)
    if isinstance(config, NcclTransportConfig):
        from magic.common.weights.nccl import NcclReceiver

        return NcclReceiver(config, worker_name)
    raise ValueError(f"unknown weight transport {config!r}")
