import json

import pytest
import torch

from magic.weights import MARKER, WEIGHTS_FILE, FilesystemWeightStore, WeightIntegrityError


def state():
    torch.manual_seed(0)
    return {"a.weight": torch.randn(4, 3), "b.bias": torch.randn(5)}


def test_publish_then_load_roundtrip(tmp_path):
    store = FilesystemWeightStore(tmp_path)
    update = store.publish("run", 3, state(), "{}")
    assert update.version == 3 and update.checksum.startswith("sha256:") and update.num_bytes > 0
    loaded = store.load(update)
    for k, v in state().items():
        assert torch.equal(loaded[k], v)
    assert store.complete_versions() == [3]


def test_a_half_written_version_is_never_loaded(tmp_path):
    store = FilesystemWeightStore(tmp_path)
    update = store.publish("run", 1, state(), "{}")
    (store.version_dir(1) / MARKER).unlink()  # as if the publisher died before the marker
    assert store.complete_versions() == []
    with pytest.raises(WeightIntegrityError, match="incomplete"):
        store.load(update)


def test_a_corrupt_version_is_refused(tmp_path):
    store = FilesystemWeightStore(tmp_path)
    update = store.publish("run", 2, state(), "{}")
    path = store.version_dir(2) / WEIGHTS_FILE
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(WeightIntegrityError, match="checksum mismatch"):
        store.load(update)


def test_marker_for_another_version_is_refused(tmp_path):
    store = FilesystemWeightStore(tmp_path)
    update = store.publish("run", 2, state(), "{}")
    marker = store.version_dir(2) / MARKER
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "version": 5}))
    with pytest.raises(WeightIntegrityError, match="holds version 5"):
        store.load(update)


def test_gc_keeps_the_newest_versions(tmp_path):
    store = FilesystemWeightStore(tmp_path)
    for v in range(5):
        store.publish("run", v, state(), "{}")
    assert store.gc(keep=2) == [0, 1, 2]
    assert store.complete_versions() == [3, 4]
    assert torch.equal(store.load_version(4)["b.bias"], state()["b.bias"])
