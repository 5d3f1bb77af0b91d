"""Training prompts in the verl / Skywork-OR1 record format: reading, validating, summarising, serving.

A record is one JSON object per line of a JSONL file, or one row of a Parquet file::

    {"prompt": [{"role": "user", "content": "..."}], "data_source": "math",
     "reward_model": {"ground_truth": "42"}, "extra_info": {...}}

`prompt` may also be a plain string (taken as one user message). Parquet files as verl writes
them (`prompt` a list of structs, `reward_model` a struct) read the same way.

Registration (`register`) validates every record and stores a summary in Redis; runs name
datasets by their registered name and the controller re-reads the file when a run starts,
refusing it if its checksum changed since registration.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from magic.config.schema import DatasetSpec
from magic.protocol.pb import messages_pb2 as pb
from magic.store.datasets import DatasetIndex


class DatasetError(ValueError):
    """A dataset file is missing or has a malformed record; the message says which record."""


@dataclass(frozen=True)
class PromptRecord:
    uid: str  # "<dataset>:<line or row number>", stable across runs
    messages: tuple[tuple[str, str], ...]
    data_source: str
    ground_truth: str
    extra_info: dict = field(default_factory=dict, hash=False, compare=False)


def parse_record(obj: object, uid: str) -> PromptRecord:
    if not isinstance(obj, dict):
        raise DatasetError(f"{uid}: a record must be a JSON object")
    prompt = obj.get("prompt")
    if isinstance(prompt, str) and prompt:
        messages = (("user", prompt),)
    elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in prompt):
        messages = tuple((str(m.get("role") or "user"), m["content"]) for m in prompt)
    else:
        raise DatasetError(f"{uid}: 'prompt' must be a non-empty string or a non-empty list of {{role, content}} messages")
    rm = obj.get("reward_model")
    if not isinstance(rm, dict) or rm.get("ground_truth") is None:
        raise DatasetError(f"{uid}: 'reward_model.ground_truth' is required")
    gt = rm["ground_truth"]
    ground_truth = gt if isinstance(gt, str) else json.dumps(gt)
    data_source = obj.get("data_source") or "math"
    if not isinstance(data_source, str):
        raise DatasetError(f"{uid}: 'data_source' must be a string")
    extra = obj.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise DatasetError(f"{uid}: 'extra_info' must be an object")
    return PromptRecord(uid, messages, data_source, ground_truth, extra)


def _format_of(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise DatasetError(f"{path}: cannot tell the format from the extension {suffix!r}; set format to 'jsonl' or 'parquet'")


MAX_LINE_CHARS = 16 * 1024 * 1024
"""A JSONL record longer than this is refused (a prompt with its ground truth is far smaller)."""


def load_records(path: str | Path, prefix: str | None = None, fmt: str = "auto") -> list[PromptRecord]:
    """Every record of a JSONL or Parquet file; raise DatasetError naming the first bad one.
    Record uids are "<prefix>:<line or row number, from 1>" (prefix: the file stem by default)."""
    path = Path(path)
    try:
        if not path.is_file():
            raise DatasetError(f"{path}: no such file")
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte, a directory we may not enter
        raise DatasetError(f"{str(path)[:200]!r}: not a readable path ({type(exc).__name__}: {getattr(exc, 'strerror', None) or exc})") from None
    prefix = prefix or path.stem
    fmt = _format_of(path, fmt)
    try:
        return _read_records(path, prefix, fmt)
    except OSError as exc:  # unreadable after all: permissions, a FIFO, an I/O error
        raise DatasetError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def _read_records(path: Path, prefix: str, fmt: str) -> list[PromptRecord]:
    records = []
    if fmt == "jsonl":
        with path.open(encoding="utf-8", errors="strict") as f:
            try:
                for lineno, line in enumerate(iter(lambda: f.readline(MAX_LINE_CHARS + 1), ""), 1):
                    uid = f"{prefix}:{lineno}"
                    if len(line) > MAX_LINE_CHARS:  # never hold a huge line (a sparse file is one line of NULs)
                        raise DatasetError(f"{uid}: line longer than {MAX_LINE_CHARS} characters")
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise DatasetError(f"{uid}: invalid JSON ({exc.msg})") from None
                    records.append(parse_record(obj, uid))
            except UnicodeDecodeError as exc:
                raise DatasetError(f"{path}: not UTF-8 text ({exc.reason})") from None
    else:
        try:
            import pyarrow.parquet as pq

            rows = pq.read_table(path).to_pylist()
        except ImportError:  # pragma: no cover - pyarrow is a dependency
            raise DatasetError("reading Parquet needs pyarrow") from None
        except Exception as exc:  # noqa: BLE001 — pyarrow raises many types for a bad file
            raise DatasetError(f"{path}: not a readable Parquet file ({exc})") from None
        records = [parse_record(row, f"{prefix}:{i}") for i, row in enumerate(rows, 1)]
    if not records:
        raise DatasetError(f"{path}: no records")
    return records


def without_ground_truth(records: list[PromptRecord]) -> str | None:
    """The uid of the first record whose ground truth is empty (it cannot be judged: no held-out
    evaluation on such a dataset), or None."""
    return next((r.uid for r in records if not r.ground_truth.strip()), None)


def load_jsonl(path: str | Path) -> list[PromptRecord]:
    """The records of a JSONL file (uids "<file stem>:<line>")."""
    return load_records(path, fmt="jsonl")


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


class DatasetInfo(BaseModel):
    """A registered dataset: where it is and what is in it."""

    name: str
    path: str
    format: str
    checksum: str
    """sha256 of the file at registration; a run refuses the file if it changed."""
    records: int
    data_sources: dict[str, int]
    """Records per data_source."""
    prompt_chars: dict[str, float]
    """min / mean / max characters of the prompt messages."""
    registered_at: float


def summarise(spec: DatasetSpec) -> tuple[DatasetInfo, list[PromptRecord]]:
    """Read and validate every record of the file; raise DatasetError on the first bad one."""
    path = Path(spec.path)
    records = load_records(path, spec.name, spec.format)
    chars = [sum(len(c) for _, c in rec.messages) for rec in records]
    info = DatasetInfo(
        name=spec.name,
        path=str(path),
        format=_format_of(path, spec.format),
        checksum=file_sha256(path),
        records=len(records),
        data_sources=dict(Counter(rec.data_source for rec in records).most_common()),
        prompt_chars={"min": min(chars), "mean": sum(chars) / len(chars), "max": max(chars)},
        registered_at=time.time(),
    )
    return info, records


class DatasetRegistry:
    """Registered datasets, validated before they are recorded in the index (`magic.store.datasets`)."""

    def __init__(self, index: DatasetIndex):
        self.index = index

    def register(self, spec: DatasetSpec, replace: bool = False) -> tuple[DatasetInfo, bool]:
        """Validate and record `spec`; returns (info, created). Registering the same file under
        the same name again is a no-op; another file under a taken name raises FileExistsError
        unless `replace`."""
        info, _ = summarise(spec)
        old = self.get(spec.name)
        if old is not None and not replace:
            if old.path == info.path and old.checksum == info.checksum:
                return old, False
            raise FileExistsError(spec.name)
        self.index.put(spec.name, info.model_dump_json())
        return info, True

    def get(self, name: str) -> DatasetInfo | None:
        raw = self.index.get(name)
        return DatasetInfo.model_validate_json(raw) if raw else None

    def list(self) -> list[DatasetInfo]:
        return sorted((DatasetInfo.model_validate_json(v) for v in self.index.values()), key=lambda d: d.name)

    def delete(self, name: str) -> bool:
        return self.index.delete(name)

    def load(self, name: str) -> list[PromptRecord]:
        """The records of a registered dataset; DatasetError if it is gone or changed."""
        info = self.get(name)
        if info is None:
            raise DatasetError(f"no dataset registered as {name!r}")
        if not Path(info.path).is_file():
            raise DatasetError(f"dataset {name!r}: {info.path} is gone")
        if file_sha256(info.path) != info.checksum:
            raise DatasetError(f"dataset {name!r}: {info.path} changed since it was registered; register it again under a new name")
        return load_records(info.path, name, info.format)


class PromptSource:
    """Serves prompts in a seeded shuffled order, epoch after epoch; position p is deterministic."""

    def __init__(self, records: list[PromptRecord], seed: int):
        if not records:
            raise DatasetError("no prompts to serve")
        self.records = records
        self.seed = seed
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            idx = list(range(len(self.records)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(idx)
            self._orders = {epoch: idx}  # keep one epoch in memory
        return self._orders[epoch]

    def take(self, position: int, count: int) -> list[PromptRecord]:
        """`count` records starting at absolute position `position` of the endless shuffled stream."""
        n = len(self.records)
        out = []
        for p in range(position, position + count):
            out.append(self.records[self._order(p // n)[p % n]])
        return out


def load_pool(registry: DatasetRegistry, names: list[str]) -> list[PromptRecord]:
    """The records of a run's datasets, each uid once, in dataset order."""
    seen: set[str] = set()
    out = []
    for name in names:
        for rec in registry.load(name):
            if rec.uid not in seen:
                seen.add(rec.uid)
                out.append(rec)
    return out


# -- records as prompt groups --------------------------------------------------------------------


def group_seed(run_seed: int, step: int, index: int) -> int:
    """The sampling seed of group `index` of step `step` (-1: estimation), fixed by the run's seed."""
    digest = hashlib.sha256(f"{run_seed}:{step}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def prompt_group(run_id: str, rec: PromptRecord, group_id: str, k: int, stage_index: int, kind: int, sampling: pb.SamplingParams) -> pb.PromptGroup:
    """The PromptGroup that asks for `sampling.n` samples of `rec` with policy version k."""
    group = pb.PromptGroup(
        run_id=run_id,
        group_id=group_id,
        step=k,
        policy_version=k,
        stage=max(stage_index, 0),
        data_source=rec.data_source,
        ground_truth=rec.ground_truth,
        extra_info_json=json.dumps(rec.extra_info) if rec.extra_info else "",
        prompt_uid=rec.uid,
        sampling=sampling,
        published_at=time.time(),
        kind=kind,
    )
    for role, content in rec.messages:
        group.messages.add(role=role, content=content)
    return group
