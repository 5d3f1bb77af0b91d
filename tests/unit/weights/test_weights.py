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


def test_streamed_safetensors_is_what_save_file_writes(tmp_path):
    """Weights published bucket by bucket (`StateBuckets`, one bucket in memory at a time) make the
    same file contents as the whole state dict: safetensors reads back every tensor exactly."""
    from safetensors.torch import load_file

    from magic.weights.base import StateBuckets
    from magic.weights.filesystem import write_safetensors

    g = torch.Generator().manual_seed(0)
    state = {"a.weight": torch.randn(7, 5, generator=g), "b.bias": torch.randn(3, generator=g).to(torch.bfloat16), "c.idx": torch.arange(4),
             "d.scalar": torch.tensor(2.5)}
    consumed = []

    def buckets():
        for names in (["a.weight"], ["b.bias", "c.idx"], ["d.scalar"]):
            consumed.append(names)
            yield {n: state[n] for n in names}

    write_safetensors(tmp_path / "m.safetensors", StateBuckets([(k, v.dtype, tuple(v.shape)) for k, v in state.items()], buckets()), {"format": "pt"})
    back = load_file(str(tmp_path / "m.safetensors"))
    assert set(back) == set(state) and all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in state.items())
    assert len(consumed) == 3
    write_safetensors(tmp_path / "whole.safetensors", state, {"format": "pt"})  # a plain state dict: one bucket
    assert all(torch.equal(load_file(str(tmp_path / "whole.safetensors"))[k], v) for k, v in state.items())


def test_buckets_that_disagree_with_their_layout_are_refused(tmp_path):
    from magic.weights.base import StateBuckets
    from magic.weights.filesystem import write_safetensors

    layout = [("a", torch.float32, (2,)), ("b", torch.float32, (3,))]
    for buckets, message in (
        ([{"a": torch.zeros(2)}], "ended before"),
        ([{"a": torch.zeros(2), "b": torch.zeros(4)}], "layout expects"),
        ([{"b": torch.zeros(3), "a": torch.zeros(2)}], "layout expects"),
    ):
        with pytest.raises(ValueError, match=message):
            write_safetensors(tmp_path / "x.safetensors", StateBuckets(layout, buckets), {})
