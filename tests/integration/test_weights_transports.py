"""Weight transports end to end: learner-side sender -> `weights` stream (real Redis) -> receiver -> engine."""

from __future__ import annotations

import pytest
import torch

from magic.protocol import keys
from magic.protocol.pb import messages_pb2 as pb
from magic.rollout.engine import TorchEngine
from magic.store.channels import RunChannels
from magic.store.streams import Stream
from magic.weights import MARKER, WEIGHTS_FILE, FilesystemWeightStore, WeightIntegrityError, make_receiver, make_sender
from magic.weights.config import FilesystemTransportConfig, HttpTransportConfig

pytestmark = pytest.mark.integration


def perturbed_state(engine: TorchEngine, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v + 0.01 * torch.randn_like(v) for k, v in engine.model.state_dict().items() if k != "lm_head.weight"}


def announced(r) -> list[pb.WeightUpdate]:
    return [u for _, u in Stream(r, keys.RunKeys("t").weights).read_after("0", pb.WeightUpdate)]


@pytest.fixture
def engine(tiny_model_dir):
    return TorchEngine(str(tiny_model_dir))


def sender_for(config, r, tmp_path, engine, keep=2):
    return make_sender(config, channels=RunChannels(r, "t", "learner"), root=tmp_path / "learner" / "weights",
                       config_json=engine.model.config.to_json_string(), keep=keep)


@pytest.mark.parametrize("config", [FilesystemTransportConfig(), HttpTransportConfig(host="127.0.0.1", port=0, advertise_url=None)], ids=["filesystem", "http"])
def test_a_published_version_reaches_the_engine(r, tmp_path, engine, tiny_model_dir, config):
    sender = sender_for(config, r, tmp_path, engine)
    if isinstance(config, HttpTransportConfig):  # reach the server on loopback whatever the hostname resolves to
        sender.base_url = f"http://127.0.0.1:{sender.server.port}"
    try:
        state = perturbed_state(engine, 1)
        sender.publish(0, perturbed_state(engine, 0))
        sender.publish(1, state)
        receiver = make_receiver(config, worker_name="w", cache_dir=tmp_path / "cache")
        worker_engine = TorchEngine(str(tiny_model_dir))
        receiver.receive_batch(announced(r), worker_engine)
        assert worker_engine.version == 1
        for k, v in state.items():
            assert torch.equal(worker_engine.model.state_dict()[k], v)
        assert torch.equal(sender.load_version(1)["model.norm.weight"], state["model.norm.weight"])  # the learner resumes from it
    finally:
        sender.close()


def test_filesystem_half_written_version_is_never_loaded(r, tmp_path, engine):
    sender = sender_for(FilesystemTransportConfig(), r, tmp_path, engine)
    update = sender.publish(0, perturbed_state(engine, 0))
    (FilesystemWeightStore(tmp_path / "learner" / "weights").version_dir(0) / MARKER).unlink()  # died before the marker
    receiver = make_receiver(FilesystemTransportConfig(marker_wait_seconds=0.3), worker_name="w", cache_dir=tmp_path)
    with pytest.raises(WeightIntegrityError, match="incomplete"):
        receiver.receive(update, engine)
    assert engine.version == -1


def test_filesystem_corrupt_version_is_refused(r, tmp_path, engine):
    sender = sender_for(FilesystemTransportConfig(), r, tmp_path, engine)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    update = sender.publish(0, perturbed_state(engine, 0))
    path = FilesystemWeightStore(tmp_path / "learner" / "weights").version_dir(0) / WEIGHTS_FILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(WeightIntegrityError, match="checksum mismatch"):
        make_receiver(FilesystemTransportConfig(), worker_name="w", cache_dir=tmp_path).receive(update, engine)
    assert engine.version == -1 and all(torch.equal(engine.model.state_dict()[k], v) for k, v in before.items())


def test_http_corrupt_download_is_refused_and_leaves_nothing_in_the_cache(r, tmp_path, engine):
    import httpx

    config = HttpTransportConfig(host="127.0.0.1", port=0)
    sender = sender_for(config, r, tmp_path, engine)
    sender.base_url = f"http://127.0.0.1:{sender.server.port}"
    try:
        update = sender.publish(0, perturbed_state(engine, 0))
        path = FilesystemWeightStore(tmp_path / "learner" / "weights").version_dir(0) / WEIGHTS_FILE
        data = bytearray(path.read_bytes())
        data[100] ^= 0xFF
        path.write_bytes(bytes(data))
        receiver = make_receiver(config, worker_name="w", cache_dir=tmp_path / "cache")
        with pytest.raises(WeightIntegrityError, match="announced"):
            receiver.receive(update, engine)
        assert engine.version == -1 and list((tmp_path / "cache").iterdir()) == []
        # only complete versions and the two file names are served
        assert httpx.get(f"{sender.base_url}/v000000/COMPLETE").status_code == 404
        assert httpx.get(f"{sender.base_url}/v000000/../../../etc/passwd").status_code == 404
        assert httpx.get(f"{sender.base_url}/v000009/model.safetensors").status_code == 404
        missing = pb.WeightUpdate(version=9, transport="http", uri=f"{sender.base_url}/v000009", checksum=update.checksum, num_bytes=update.num_bytes)
        with pytest.raises(WeightIntegrityError, match="404"):
            receiver.receive(missing, engine)
    finally:
        sender.close()


def test_a_catching_up_worker_loads_only_the_newest_version(r, tmp_path, engine, tiny_model_dir):
    """Old versions are garbage-collected; a new worker reading the stream from the start must skip them."""
    sender = sender_for(FilesystemTransportConfig(), r, tmp_path, engine, keep=2)
    states = [perturbed_state(engine, v) for v in range(5)]
    for v, s in enumerate(states):
        sender.publish(v, s)
    assert FilesystemWeightStore(tmp_path / "learner" / "weights").complete_versions() == [3, 4]
    late = TorchEngine(str(tiny_model_dir))
    make_receiver(FilesystemTransportConfig(), worker_name="late", cache_dir=tmp_path).receive_batch(announced(r), late)
    assert late.version == 4 and torch.equal(late.model.state_dict()["model.norm.weight"], states[4]["model.norm.weight"])
