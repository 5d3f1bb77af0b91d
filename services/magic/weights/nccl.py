"""Transport `nccl`: vLLM's built-in NCCL weight transfer, for GPU rollout pods running vLLM.

Pinned to **vLLM 0.33.0**. The learner drives vLLM's trainer API
(`vllm/distributed/weight_transfer/nccl_engine.py`: `NCCLTrainerWeightTransferEngine.trainer_init`
and `send_weights`); its control plane (`VLLMWeightSyncClient`, a structural protocol in
`vllm/distributed/weight_transfer/base.py`) is `RedisRelayClient` here: instead of calling one vLLM
server, it announces each phase on the run's `weights` stream, and every member rollout worker
relays it to its own vLLM server's routes (`vllm/entrypoints/rl/online/api_router.py`):

    learner (rank 0)                         weights stream          rollout worker -> its vLLM server
    trainer_init: open TCPStore + NCCL  ∥    WeightUpdate{join}  ->  POST /init_weight_transfer_engine
    send_weights: broadcast every tensor ∥   WeightUpdate{update} -> POST /pause, /start_weight_update,
                                                                      /update_weights, /finish_weight_update
                                                                      {"weight_version": "k"}, /resume
                  wait until every member reports version k in the run's weight_versions hash

Members are the live rollout workers whose heartbeat advertises an NCCL endpoint (instance id
and GPU count); when that set changes the learner opens a new group (next port) and the new
members join it. A worker that is not in the current group — new, or restarted — loads the
filesystem snapshot of the same version, written in the background after each broadcast.

Limits (it cannot run on this project's CPU-only CI): NCCL has no per-call timeout, so a member
that dies in the middle of a broadcast leaves the learner blocked until its liveness probe
restarts it (the restarted learner resumes from the last snapshot and opens a new group).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from functools import cached_property
from typing import Protocol

import torch

from magic.protocol.pb import messages_pb2 as pb
from magic.store.channels import RunChannels
from magic.weights.base import CheckpointLoader, StateBuckets, WeightReceiver, WeightSender
from magic.weights.config import FilesystemTransportConfig, NcclTransportConfig
from magic.weights.filesystem import FilesystemReceiver, FilesystemWeightStore

log = logging.getLogger(__name__)

TRANSPORT = "nccl"
VLLM_VERSION = "0.33.0"


def live_members(channels: RunChannels) -> dict[str, int]:
    """Live rollout workers of the run with an NCCL endpoint: "<worker>/<instance>" -> GPUs of its vLLM server."""
    out = {}
    for name, status in channels.alive("rollout").items():
        endpoint = status.get("nccl")
        if isinstance(endpoint, dict) and endpoint.get("gpus"):
            out[f"{name}/{endpoint['instance']}"] = int(endpoint["gpus"])
    return out


def group_message(group_id: int, payload: dict, members: dict[str, int]) -> pb.NcclGroup:
    """The join message for vLLM's worker init payload (`build_worker_init_payload`, rank_offset 1),
    with one rank offset per member: the learner is rank 0, members follow in name order."""
    offsets, rank = {}, 1
    for key in sorted(members):
        offsets[key] = rank
        rank += members[key]
    if payload.get("world_size") != rank:
        raise ValueError(f"NCCL world size {payload.get('world_size')} does not match 1 + member GPUs = {rank}")
    return pb.NcclGroup(
        id=group_id,
        master_address=payload["master_address"],
        master_port=int(payload["master_port"]),
        world_size=rank,
        rank_offsets=offsets,
        packed=bool(payload.get("packed", False)),
        packed_buffer_size_bytes=int(payload.get("packed_buffer_size_bytes", 0)),
        packed_num_buffers=int(payload.get("packed_num_buffers", 0)),
    )


def _wait_until(predicate, timeout: float, interval: float, what: str) -> None:
    """Poll `predicate` until it is true; TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class RedisRelayClient:
    """vLLM's `VLLMWeightSyncClient` protocol, relayed to the member rollout workers over Redis."""

    def __init__(self, channels: RunChannels, members: dict[str, int], group_id: int, wait_seconds: float):
        self.channels = channels
        self.run_id = channels.run_id
        self.stream = channels.stream("weights")
        self.members = members
        self.group_id = group_id
        self.wait_seconds = wait_seconds
        self.version = 0  # the version being sent (set by the sender before each round)
        self.snapshot_uri = ""  # where workers outside the group find the same version

    def _announce(self, transfer: pb.NcclTransfer) -> None:
        self.stream.add(
            pb.WeightUpdate(
                run_id=self.run_id, version=self.version, transport=TRANSPORT, uri=self.snapshot_uri, nccl=transfer, published_at=time.time(),
                epoch=self.channels.fence.epoch if self.channels.fence is not None else 0,
            )
        )

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self._announce(pb.NcclTransfer(join=group_message(self.group_id, init_info, self.members)))

    def start_weight_update(self) -> None:
        """Members call /start_weight_update themselves, right before /update_weights."""

    def update_weights(self, update_info: dict) -> None:
        tensors = [
            pb.TensorSpec(name=n, dtype=d, shape=s)
            for n, d, s in zip(update_info.get("names", []), update_info.get("dtype_names", []), update_info.get("shapes", []))
        ]
        self._announce(pb.NcclTransfer(update=pb.NcclUpdate(group_id=self.group_id, tensors=tensors)))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Wait until every member serves the version (members finish with weight_version = k)."""
        names = {key.split("/")[0] for key in self.members}

        def done() -> bool:
            served = self.channels.steps.served_versions()
            return all(served.get(n, -1) >= self.version for n in names)

        _wait_until(done, self.wait_seconds, interval=0.02, what=f"rollout workers {sorted(names)} to load v{self.version} by NCCL")


class NcclSender(WeightSender):
    """Broadcast each version with vLLM's trainer API; snapshot it for pods outside the group."""

    def __init__(self, channels: RunChannels, store: FilesystemWeightStore, config_json: str, keep: int, config: NcclTransportConfig):
        self.channels = channels
        self.run_id = channels.run_id
        self.store = store
        self.stream = channels.stream("weights")
        self.config_json = config_json
        self.keep = keep
        self.config = config
        self.group_id = 0
        self.members: dict[str, int] = {}
        self.engine = None
        self.client: RedisRelayClient | None = None
        self.source = None
        self._snapshot: threading.Thread | None = None

    def publish(self, version: int, state_dict) -> pb.WeightUpdate:
        """`state_dict`: a state dict or `StateBuckets`; each tensor is moved to this GPU in the wire
        dtype as vLLM's engine sends it, so the GPU holds one tensor of the wire copy at a time
        (and the learner one gathered bucket); the snapshot's host copy is the whole model."""
        if self._snapshot is not None:
            self._snapshot.join()  # one snapshot at a time, in version order
        buckets = StateBuckets.of(state_dict)
        members = live_members(self.channels)
        snapshot_uri = str(self.store.version_dir(version).resolve()) if self.config.snapshot or not members else ""
        if not members:  # nobody to broadcast to (all pods are catching up): the snapshot is the version
            self.store.write(version, buckets, self.config_json)
            update = pb.WeightUpdate(run_id=self.run_id, version=version, transport=TRANSPORT, uri=snapshot_uri, published_at=time.time(), epoch=self.store.epoch)
            self.stream.add(update)
            return update
        dtype = getattr(torch, self.config.dtype)
        layout = [(name, dtype if d.is_floating_point else d, shape) for name, d, shape in buckets.layout]
        cpu: dict[str, torch.Tensor] | None = {} if self.config.snapshot else None

        def wire():  # one pass, driven by vLLM's send_weights
            for name, t in buckets.items():
                if cpu is not None:
                    cpu[name] = t.detach().to("cpu", copy=True)
                yield name, t.detach().to("cuda", dtype if t.is_floating_point() else t.dtype)

        if members != self.members or self.engine is None:
            self._open_group(version, members, layout, snapshot_uri)
        self.source.items = wire
        self.client.version, self.client.snapshot_uri = version, snapshot_uri
        self.engine.send_weights()
        if cpu is not None:
            self._snapshot = threading.Thread(target=self._write_snapshot, args=(version, cpu), name=f"snapshot-v{version}", daemon=True)
            self._snapshot.start()
        return pb.WeightUpdate(run_id=self.run_id, version=version, transport=TRANSPORT, uri=snapshot_uri, published_at=time.time(), epoch=self.store.epoch)

    def _open_group(self, version: int, members: dict[str, int], layout: list, snapshot_uri: str) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

        if self.engine is not None:
            self.engine.shutdown()
        self.group_id += 1
        self.members = members
        self.client = RedisRelayClient(self.channels, members, self.group_id, self.config.member_wait_seconds)
        self.client.version, self.client.snapshot_uri = version, snapshot_uri
        self.source = state_dict_source(layout)
        info = NCCLTrainerInitInfo(
            master_address=self.config.master_address or socket.gethostname(),
            master_port=self.config.master_port + self.group_id - 1,
            world_size=1 + sum(members.values()),
            rank=0,
            packed=self.config.packed,
            packed_buffer_size_bytes=self.config.packed_buffer_size_bytes,
            packed_num_buffers=self.config.packed_num_buffers,
        )
        log.info("opening NCCL group %d with %s (world size %d)", self.group_id, sorted(members), info.world_size)
        self.engine = NCCLTrainerWeightTransferEngine.trainer_init(info, client=self.client, source=self.source)

    def _write_snapshot(self, version: int, state: dict[str, torch.Tensor]) -> None:
        try:
            self.store.write(version, state, self.config_json)
            self.store.gc(keep=self.keep)
        except Exception:  # noqa: BLE001 — a failed snapshot only delays catching-up pods
            log.exception("writing the snapshot of v%d failed", version)

    def load_version(self, version: int) -> dict[str, torch.Tensor]:
        if self._snapshot is not None:
            self._snapshot.join()
        return self.store.load_version(version)

    def close(self) -> None:
        if self._snapshot is not None:
            self._snapshot.join()
        if self.engine is not None:
            self.engine.shutdown()


def state_dict_source(layout: list[tuple[str, torch.dtype, tuple[int, ...]]]):
    """A vLLM `WeightSource` whose metadata is the published layout (name, wire dtype, shape) and
    whose `iter_full` is the current round's (name, tensor) pairs, set by the sender before each
    round (`items`, a function making one pass)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class StateDictSource(WeightSource):
        def __init__(self, layout):
            self.layout = layout
            self.items = lambda: iter(())

        @cached_property
        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(name, dtype, tuple(shape)) for name, dtype, shape in self.layout]

        def iter_full(self):
            yield from self.items()

    return StateDictSource(layout)


class NcclEndpoint(CheckpointLoader, Protocol):
    """What an engine needs to take part in the broadcast (the vLLM engine has it)."""

    def nccl_gpus(self) -> int:
        """GPUs (NCCL ranks) of the engine's server."""

    def join_nccl_group(self, group: pb.NcclGroup, rank_offset: int) -> None:
        """POST /init_weight_transfer_engine."""

    def receive_nccl(self, version: int, update: pb.NcclUpdate) -> None:
        """Receive `version` by broadcast and serve it."""


class NcclReceiver(WeightReceiver):
    """Relay the phases addressed to this worker; outside the group, load the snapshot."""

    def __init__(self, config: NcclTransportConfig, worker_name: str):
        self.member_key = f"{worker_name}/{uuid.uuid4().hex[:12]}"
        self.group_id: int | None = None
        self.snapshots = FilesystemReceiver(FilesystemTransportConfig(marker_wait_seconds=config.member_wait_seconds))

    def endpoint_status(self, engine) -> dict:
        """What the heartbeat advertises so the learner counts this worker as a member."""
        gpus = engine.nccl_gpus() if hasattr(engine, "nccl_gpus") else 0
        return {"nccl": {"instance": self.member_key.split("/", 1)[1], "gpus": gpus}} if gpus else {}

    def receive_batch(self, updates: list[pb.WeightUpdate], engine) -> None:
        for i, update in enumerate(updates):
            phase = update.nccl.WhichOneof("phase")
            if phase == "join" and self.member_key in update.nccl.join.rank_offsets:
                engine.join_nccl_group(update.nccl.join, update.nccl.join.rank_offsets[self.member_key])
                self.group_id = update.nccl.join.id
            elif phase == "update" and update.nccl.update.group_id == self.group_id:
                engine.receive_nccl(update.version, update.nccl.update)
            elif phase != "join" and update.version > engine.version and not _newer_follows(updates[i + 1 :], update.version):
                self.snapshots.receive(update, engine)

    def receive(self, update: pb.WeightUpdate, engine) -> None:
        self.receive_batch([update], engine)


def _newer_follows(rest: list[pb.WeightUpdate], version: int) -> bool:
    return any(u.version > version and u.nccl.WhichOneof("phase") != "join" for u in rest)
