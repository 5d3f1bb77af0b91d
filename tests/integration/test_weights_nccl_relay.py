"""The `nccl` transport's control plane without GPUs: the learner-side relay (vLLM's
VLLMWeightSyncClient protocol over Redis) and the rollout-side receiver driving a vLLM-shaped
HTTP server. The NCCL data plane itself needs GPUs and vLLM and is not exercised here."""

from __future__ import annotations

import json
import threading
import time

import pytest

from magic.protocol import keys
from magic.protocol.pb import messages_pb2 as pb
from magic.rollout.vllm_engine import VllmEngine
from magic.store.channels import RunChannels
from magic.store.streams import Stream
from magic.weights import FilesystemWeightStore
from magic.weights.config import NcclTransportConfig
from magic.weights.nccl import NcclReceiver, RedisRelayClient, live_members
from tests.unit.rollout.vllm_server import FakeVllm

pytestmark = pytest.mark.integration


@pytest.fixture
def vllm():
    server = FakeVllm(world_size=2)
    yield server
    server.close()


def heartbeat(r, name, status):
    r.set(keys.heartbeat("rollout", name), json.dumps({"run": "t", "at": time.time(), **status}), px=10_000)


def test_members_are_live_workers_advertising_an_endpoint(r):
    heartbeat(r, "a", {"nccl": {"instance": "i1", "gpus": 2}})
    heartbeat(r, "b", {"nccl": {"instance": "i2", "gpus": 1}})
    heartbeat(r, "c", {})  # torch engine: no endpoint
    r.set(keys.heartbeat("rollout", "d"), json.dumps({"run": "other", "at": time.time(), "nccl": {"instance": "i3", "gpus": 1}}), ex=10)
    assert live_members(RunChannels(r, "t", "learner")) == {"a/i1": 2, "b/i2": 1}


def test_relay_and_receiver_run_vllms_protocol_for_members_and_snapshots_for_others(r, vllm, tmp_path, tiny_model_dir):
    stream = Stream(r, keys.RunKeys("t").weights)
    member = NcclReceiver(NcclTransportConfig(member_wait_seconds=2), "a")
    outsider = NcclReceiver(NcclTransportConfig(member_wait_seconds=2), "b")
    engine = VllmEngine(vllm.url, str(tiny_model_dir), timeout=10)
    status = member.endpoint_status(engine)
    assert status["nccl"]["gpus"] == 2
    members = {member.member_key: 2}
    relay = RedisRelayClient(RunChannels(r, "t", "learner"), members, group_id=1, wait_seconds=5)
    relay.version, relay.snapshot_uri = 1, str(tmp_path / "v000001")

    # what vLLM's NCCLTrainerWeightTransferEngine calls, in its order
    relay.init_weight_transfer_engine({"master_address": "learner", "master_port": 29600, "rank_offset": 1, "world_size": 3,
                                       "packed": True, "packed_buffer_size_bytes": 1 << 30, "packed_num_buffers": 2})
    relay.start_weight_update()
    relay.update_weights({"names": ["model.norm.weight"], "dtype_names": ["bfloat16"], "shapes": [[32]]})
    finished = threading.Thread(target=relay.finish_weight_update)
    finished.start()

    updates = [u for _, u in stream.read_after("0", pb.WeightUpdate)]
    assert [u.nccl.WhichOneof("phase") for u in updates] == ["join", "update"]
    assert dict(updates[0].nccl.join.rank_offsets) == {member.member_key: 1}
    member.receive_batch(updates, engine)
    assert vllm.paths() == ["/init_weight_transfer_engine", "/pause", "/start_weight_update", "/update_weights", "/finish_weight_update", "/resume"]
    assert engine.version == 1 and vllm.weight_version == "1"
    r.hset(keys.RunKeys("t").weight_versions, "a", 1)  # the worker acknowledges, as RolloutWorker does
    finished.join(timeout=5)
    assert not finished.is_alive()

    # a worker outside the group loads the filesystem snapshot of the same version
    from safetensors.torch import load_file  # the model's own tensors: the engine refuses a snapshot of another model

    tensors = {name: t for path in sorted(tiny_model_dir.glob("*.safetensors")) for name, t in load_file(path).items()}
    FilesystemWeightStore(tmp_path).write(1, tensors, "{}")
    other_server = FakeVllm(world_size=1)
    try:
        other = VllmEngine(other_server.url, str(tiny_model_dir), timeout=10)
        outsider.receive_batch(updates, other)
        assert other_server.paths() == ["/pause", "/collective_rpc", "/update_weight_version", "/resume"]
        assert other.version == 1
    finally:
        other_server.close()


def test_finish_times_out_with_the_missing_members_named(r):
    relay = RedisRelayClient(RunChannels(r, "t", "learner"), {"a/x": 1, "b/y": 1}, group_id=1, wait_seconds=0.3)
    relay.version = 4
    r.hset(keys.RunKeys("t").weight_versions, "a", 4)
    with pytest.raises(TimeoutError, match="load v4 by NCCL"):
        relay.finish_weight_update()
