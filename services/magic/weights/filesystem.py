"""Transport `filesystem`: versioned safetensors directories on a volume every pod mounts.

The learner publishes policy version k as a directory `<root>/v<k:06d>/` holding the Hugging
Face `config.json` and `model.safetensors`, then writes a completion marker `COMPLETE` with each
file's SHA-256 (the manifest; the weights' size too). A directory without the marker (a publish still in progress, or one
that died half-way) is never loaded; a marker or file that does not match the announcement is
refused with `WeightIntegrityError`. Old versions are garbage-collected, keeping the newest few.

Publishing writes into a hidden temporary directory, fsyncs, and renames it into place, so
readers never see a partial `v<k>` directory; the marker is written (and fsynced) last.
"""

from __future__ import annotations

import json
import logging
import re
import os
import shutil
import time
import uuid
from pathlib import Path

import torch

from magic.protocol.pb import messages_pb2 as pb
from magic.runtime.files import fsync_path, sha256_hex, write_durably
from magic.store.streams import Stream
from magic.weights.base import Checkpoint, CheckpointLoader, StateBuckets, WeightIntegrityError, WeightReceiver, WeightSender, WeightState
from magic.weights.config import FilesystemTransportConfig

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
MARKER = "COMPLETE"
TRANSPORT = "filesystem"


_SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
    torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}


def write_safetensors(path: Path, state: WeightState, metadata: dict[str, str]) -> None:
    """`state` into one safetensors file, streamed bucket by bucket: the header (every tensor's
    dtype, shape and offsets) is known from the layout before the first bucket arrives, so no
    more than one bucket is ever in memory here. The file is what `safetensors.torch.save_file`
    writes for the same tensors, up to their order in it."""
    buckets = StateBuckets.of(state)
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    for name, dtype, shape in buckets.layout:
        if dtype not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{name}: dtype {dtype} has no safetensors name")
        size = torch.empty((), dtype=dtype).element_size()
        for d in shape:
            size *= d
        header[name] = {"dtype": _SAFETENSORS_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for _name, tensor in buckets.items():
            t = tensor.detach().to("cpu").contiguous().reshape(-1)
            f.write(memoryview(t.view(torch.uint8).numpy()))
        if f.tell() != 8 + len(raw) + offset:
            raise ValueError(f"{path}: wrote {f.tell()} bytes, the header promises {8 + len(raw) + offset}")


def sha256_file(path: Path) -> str:
    """The file's checksum as announcements carry it: ``sha256:<hex>``."""
    return "sha256:" + sha256_hex(path)


_DIR = re.compile(r"^v(\d{6})(?:-e(\d+))?$")


class FilesystemWeightStore:
    """Versioned weights under `root` (one run's weights directory).

    Version k written under the learner lease's epoch e lives in `v<k:06d>-e<e>` (`v<k:06d>` for
    epoch 0: stores without a lease, a rollout worker's download cache), so a learner that lost
    its lease and resumes writing never replaces the files of the learner that took over: each
    announcement names its own directory. Readers take, for each version, its newest epoch.
    """

    def __init__(self, root: Path, epoch: int = 0):
        self.root = Path(root)
        self.epoch = epoch

    def version_dir(self, version: int, epoch: int | None = None) -> Path:
        """Where version `version` written under `epoch` (this store's) lives."""
        epoch = self.epoch if epoch is None else epoch
        return self.root / (f"v{version:06d}-e{epoch}" if epoch else f"v{version:06d}")

    def _complete_dirs(self) -> dict[int, Path]:
        """Version -> the directory of its newest epoch that is complete (has its marker)."""
        if not self.root.exists():
            return {}
        best: dict[int, tuple[int, Path]] = {}
        for d in self.root.iterdir():
            match = _DIR.match(d.name)
            if match and d.is_dir() and (d / MARKER).exists():
                version, epoch = int(match.group(1)), int(match.group(2) or 0)
                if version not in best or epoch > best[version][0]:
                    best[version] = (epoch, d)
        return {v: d for v, (_, d) in best.items()}

    def write(self, version: int, state_dict: WeightState, config_json: str) -> tuple[Path, str, int]:
        """Write version `version` atomically (a state dict, or `StateBuckets` streamed bucket by
        bucket); returns (directory, checksum, size of the weights file)."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.version_dir(version)
        tmp = self.root / f".{final.name}.partial-{uuid.uuid4().hex}"
        tmp.mkdir()
        weights = tmp / WEIGHTS_FILE
        try:
            write_safetensors(weights, state_dict, metadata={"format": "pt", "magic_version": str(version)})
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_path(weights)
        (tmp / CONFIG_FILE).write_text(config_json)
        fsync_path(tmp / CONFIG_FILE)
        checksum, size = sha256_file(weights), weights.stat().st_size
        files = {WEIGHTS_FILE: checksum, CONFIG_FILE: sha256_file(tmp / CONFIG_FILE)}
        if final.exists():  # a previous attempt at this version (learner restarted mid-publish)
            shutil.rmtree(final)
        os.replace(tmp, final)
        write_durably(final / MARKER, json.dumps({"version": version, "checksum": checksum, "num_bytes": size, "files": files}))
        return final, checksum, size

    def publish(self, run_id: str, version: int, state_dict: WeightState, config_json: str) -> pb.WeightUpdate:
        """Write version `version` and return the WeightUpdate that announces it."""
        final, checksum, size = self.write(version, state_dict, config_json)
        return pb.WeightUpdate(
            run_id=run_id, version=version, transport=TRANSPORT, uri=str(final.resolve()), checksum=checksum, num_bytes=size,
            published_at=time.time(), epoch=self.epoch,
        )

    @staticmethod
    def verify(directory: Path, version: int, checksum: str = "", num_bytes: int = 0, check_hash: bool = True) -> Checkpoint:
        """Check `directory` holds complete, intact weights of `version`; raise WeightIntegrityError if not."""
        directory = Path(directory)
        marker = directory / MARKER
        if not marker.exists():
            raise WeightIntegrityError(f"weights v{version} at {directory} are incomplete: no {MARKER} marker")
        try:
            meta = json.loads(marker.read_text())
        except ValueError as exc:
            raise WeightIntegrityError(f"weights v{version}: unreadable marker {marker}: {exc}") from exc
        weights = directory / WEIGHTS_FILE
        if meta.get("version") != version:
            raise WeightIntegrityError(f"{directory} holds version {meta.get('version')}, expected {version}")
        if not weights.exists() or weights.stat().st_size != meta.get("num_bytes") or (num_bytes and num_bytes != meta.get("num_bytes")):
            raise WeightIntegrityError(f"weights v{version}: {weights} is missing or has the wrong size")
        if check_hash:
            for name, digest in (meta.get("files") or {}).items():
                if name != WEIGHTS_FILE and (not (directory / name).is_file() or sha256_file(directory / name) != digest):
                    raise WeightIntegrityError(f"weights v{version}: {directory / name} is missing or does not match its SHA-256 in {MARKER}")
            actual = sha256_file(weights)
            if actual != meta.get("checksum") or (checksum and actual != checksum):
                raise WeightIntegrityError(
                    f"weights v{version}: checksum mismatch for {weights} (file {actual}, announced {checksum or meta.get('checksum')})"
                )
        return Checkpoint(version, directory)

    @staticmethod
    def load(update: pb.WeightUpdate, verify: bool = True) -> dict[str, torch.Tensor]:
        """The state dict of a filesystem `update`; raises WeightIntegrityError if it is partial or corrupt."""
        from safetensors.torch import load_file

        checkpoint = FilesystemWeightStore.verify(Path(update.uri), update.version, update.checksum, update.num_bytes, check_hash=verify)
        return load_file(str(checkpoint.directory / WEIGHTS_FILE))

    def load_version(self, version: int) -> dict[str, torch.Tensor]:
        """The state dict of a version in this store (checked like `load`)."""
        from safetensors.torch import load_file

        directory = self._complete_dirs().get(version, self.version_dir(version))
        checkpoint = self.verify(directory, version)
        return load_file(str(checkpoint.directory / WEIGHTS_FILE))

    def complete_versions(self) -> list[int]:
        return sorted(self._complete_dirs())

    def gc(self, keep: int) -> list[int]:
        """Delete all but the newest `keep` complete versions (every epoch's directory of them) and
        any stale partial directory."""
        versions = self.complete_versions()
        doomed = versions[:-keep] if keep > 0 else versions
        for d in self.root.iterdir() if doomed else []:
            match = _DIR.match(d.name)
            if match and int(match.group(1)) in doomed:
                shutil.rmtree(d, ignore_errors=True)
        if self.root.exists():
            for d in self.root.iterdir():
                if d.name.startswith(".") and ".partial-" in d.name and time.time() - d.stat().st_mtime > 3600:
                    shutil.rmtree(d, ignore_errors=True)
        return doomed


class FilesystemSender(WeightSender):
    """Write each version into the shared store, announce it, keep the newest `keep`."""

    def __init__(self, run_id: str, store: FilesystemWeightStore, stream: Stream, config_json: str, keep: int):
        self.run_id = run_id
        self.store = store
        self.stream = stream
        self.config_json = config_json
        self.keep = keep

    def publish(self, version: int, state_dict: WeightState) -> pb.WeightUpdate:
        update = self.store.publish(self.run_id, version, state_dict, self.config_json)
        self.stream.add(update)
        self.store.gc(keep=self.keep)
        return update

    def load_version(self, version: int) -> dict[str, torch.Tensor]:
        return self.store.load_version(version)


class FilesystemReceiver(WeightReceiver):
    """Check the announced directory (waiting briefly for its marker) and have the engine load it."""

    def __init__(self, config: FilesystemTransportConfig):
        self.config = config

    def receive(self, update: pb.WeightUpdate, engine: CheckpointLoader) -> None:
        engine.load_checkpoint(self.checkpoint(update))

    def checkpoint(self, update: pb.WeightUpdate) -> Checkpoint:
        """The verified directory of `update`, waiting up to `marker_wait_seconds` for its marker."""
        if not update.uri:
            raise WeightIntegrityError(f"weights v{update.version}: the announcement names no directory")
        directory = Path(update.uri)
        deadline = time.monotonic() + self.config.marker_wait_seconds
        while not (directory / MARKER).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        return FilesystemWeightStore.verify(directory, update.version, update.checksum, update.num_bytes)
