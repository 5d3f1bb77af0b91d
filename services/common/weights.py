"""Weight transport `filesystem`: versioned safetensors directories on a shared volume.

The learner publishes policy version k as a directory `<root>/v<k:06d>/` holding the Hugging
Face `config.json` and `model.safetensors`, then writes a completion marker `COMPLETE` with the
file's SHA-256 and size. A directory without the marker (a publish still in progress, or one
that died half-way) is never loaded; a marker whose checksum does not match the file is refused
with `WeightIntegrityError`. Old versions are garbage-collected, keeping the newest few.

Publishing writes into a hidden temporary directory and renames it into place, so readers never
see a partial `v<k>` directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path

import torch

from magic.common.pb import messages_pb2 as pb

WEIGHTS_FILE = "model.safetensors"
MARKER = "COMPLETE"
TRANSPORT = "filesystem"


class WeightIntegrityError(RuntimeError):
    """A published weight version is incomplete or does not match its checksum."""


def sha256_file(path: Path, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return "sha256:" + h.hexdigest()


def _fsync_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class FilesystemWeightStore:
    """Versioned weights under `root` (one run's weights directory on the shared volume)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def version_dir(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    def publish(self, run_id: str, version: int, state_dict: dict[str, torch.Tensor], config_json: str) -> pb.WeightUpdate:
        """Write version `version` and return the WeightUpdate that announces it."""
        from safetensors.torch import save_file

        self.root.mkdir(parents=True, exist_ok=True)
        final = self.version_dir(version)
        tmp = self.root / f".{final.name}.partial-{uuid.uuid4().hex}"
        tmp.mkdir()
        weights = tmp / WEIGHTS_FILE
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
        save_file(tensors, str(weights), metadata={"format": "pt", "magic_version": str(version)})
        (tmp / "config.json").write_text(config_json)
        checksum, size = sha256_file(weights), weights.stat().st_size
        if final.exists():  # a previous attempt at this version (learner restarted mid-publish)
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_write(final / MARKER, json.dumps({"version": version, "checksum": checksum, "num_bytes": size}))
        return pb.WeightUpdate(
            run_id=run_id,
            version=version,
            transport=TRANSPORT,
            uri=str(final.resolve()),
            checksum=checksum,
            num_bytes=size,
            published_at=time.time(),
        )

    @staticmethod
    def load(update: pb.WeightUpdate, verify: bool = True) -> dict[str, torch.Tensor]:
        """The state dict of `update`; raises WeightIntegrityError if it is partial or corrupt."""
        from safetensors.torch import load_file

        directory = Path(update.uri)
        marker = directory / MARKER
        if not marker.exists():
            raise WeightIntegrityError(f"weights v{update.version} at {directory} are incomplete: no {MARKER} marker")
        meta = json.loads(marker.read_text())
        weights = directory / WEIGHTS_FILE
        if meta.get("version") != update.version:
            raise WeightIntegrityError(f"{directory} holds version {meta.get('version')}, expected {update.version}")
        if not weights.exists() or weights.stat().st_size != meta["num_bytes"]:
            raise WeightIntegrityError(f"weights v{update.version}: {weights} is missing or has the wrong size")
        if verify:
            actual = sha256_file(weights)
            if actual != meta["checksum"] or (update.checksum and actual != update.checksum):
                raise WeightIntegrityError(
                    f"weights v{update.version}: checksum mismatch for {weights} (file {actual}, announced {update.checksum or meta['checksum']})"
                )
        return load_file(str(weights))

    def load_version(self, version: int) -> dict[str, torch.Tensor]:
        """The state dict of a version in this store (checked like `load`)."""
        directory = self.version_dir(version)
        marker = directory / MARKER
        if not marker.exists():
            raise WeightIntegrityError(f"weights v{version} at {directory} are incomplete: no {MARKER} marker")
        meta = json.loads(marker.read_text())
        update = pb.WeightUpdate(version=version, transport=TRANSPORT, uri=str(directory), checksum=meta["checksum"], num_bytes=meta["num_bytes"])
        return self.load(update)

    def complete_versions(self) -> list[int]:
        if not self.root.exists():
            return []
        out = []
        for d in self.root.iterdir():
            if d.is_dir() and d.name.startswith("v") and d.name[1:].isdigit() and (d / MARKER).exists():
                out.append(int(d.name[1:]))
        return sorted(out)

    def gc(self, keep: int) -> list[int]:
        """Delete all but the newest `keep` complete versions and any stale partial directory."""
        versions = self.complete_versions()
        doomed = versions[:-keep] if keep > 0 else versions
        for v in doomed:
            shutil.rmtree(self.version_dir(v), ignore_errors=True)
        if self.root.exists():
            for d in self.root.iterdir():
                if d.name.startswith(".") and ".partial-" in d.name and time.time() - d.stat().st_mtime > 3600:
                    shutil.rmtree(d, ignore_errors=True)
        return doomed
