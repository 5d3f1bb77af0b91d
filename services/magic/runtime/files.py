"""Files that survive a crash or a power cut: written whole or not at all, and on disk before use.

`write_durably` writes a temporary file next to the target, fsyncs it, renames it over the target
and fsyncs the directory, so a reader sees the old content or the new one, never a mix, and a
power cut after it returns loses nothing. `fsync_tree` flushes files already written (a
checkpoint's) and their directories before a completion marker is written. `sha256_hex` is the
digest the completion markers (checkpoints', published weights') vouch for a file with.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path


def sha256_hex(path: Path, chunk: int = 8 << 20) -> str:
    """The SHA-256 of the file at `path`, in hex, read `chunk` bytes at a time."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fsync_path(path: Path) -> None:
    """Flush a file's or a directory's content and metadata to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: str | bytes) -> None:
    """Replace `path` with `data` atomically and durably."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    with tmp.open("wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def fsync_tree(root: Path) -> None:
    """Flush every file under `root`, then every directory bottom-up, then `root`'s parent."""
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            fsync_path(Path(dirpath) / name)
        fsync_path(Path(dirpath))
    fsync_path(root.parent)
