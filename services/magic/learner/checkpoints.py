"""Checkpoints of the learner: a directory per policy version that loads as a Hugging Face model on its own.

One numbering (the docs', the CLI's, the step records'): checkpoint `step-<K>` holds the policy
after K training steps, i.e. policy version K — the weights step K's record validates and step K
starts from (steps count from 0; `magic export RUN --step K`). A stage's or the plan's end and a
new best validation figure get a checkpoint of their own (`magic.store.steps`: the controller
asks for one; the learner writes it before training on), beside every `checkpoint_every`-th version.

Layout: root/step-<K>/ {config.json, generation_config.json, model.safetensors (HF format; the
float32 master weights), the tokenizer and chat template of the run's model, optimizer.pt or
deepspeed/ (partitioned state), ema_reference.safetensors (with an EMA reference),
trainer_state.json, COMPLETE}: the directory loads as it is with `from_pretrained` and `vllm serve`.

COMPLETE is the checkpoint's manifest: every file's size and SHA-256, the step, the policy
version and the learner lease epoch that wrote it, written (and fsynced) once every file is fsynced. A checkpoint without
it, whose files do not match it (`verify`: a write cut short, a disk that lost or zeroed blocks,
a file replaced), or that does not parse (`problem`), is never loaded.

Writes are fenced like every other write of the learner: a checkpoint is written into a hidden
directory and renamed into place only if the writer still holds the learner lease (`fence`) and
no intact checkpoint of that version is there already. So a learner paused past its lease and
resumed never replaces the checkpoint its replacement wrote. The oldest beyond `keep` are deleted,
except the one of the version `protect` names (the best validation's, `ValidationConfig.best_by`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from magic.learner.backends import PUBLISH_BUCKET_BYTES
from magic.learner.loading import SafetensorsFile
from magic.protocol.layout import CHECKPOINT_MANIFEST, checkpoint_name
from magic.runtime.files import fsync_path, fsync_tree, sha256_hex, write_durably
from magic.weights.base import StateBuckets
from magic.weights.filesystem import write_safetensors

log = logging.getLogger(__name__)

EMA_REFERENCE_FILE = "ema_reference.safetensors"
"""The EMA reference policy's weights in a checkpoint (present when a stage used one)."""
TRAINER_STATE_FILE = "trainer_state.json"
"""The policy version, the last step trained and the entropy controller's state."""
COMPLETE = CHECKPOINT_MANIFEST
"""Written last: a checkpoint without it is never loaded."""


def step_dir(root: Path, version: int) -> Path:
    """The checkpoint of policy version `version` (the weights after `version` steps)."""
    return root / checkpoint_name(version)


def version_of(directory: Path) -> int:
    """The policy version checkpoint `directory` holds: its trainer state's `policy_version`; a
    checkpoint written before versions were recorded holds its last trained step + 1."""
    state = read_trainer_state(directory)
    return int(state["policy_version"]) if "policy_version" in state else int(state["step"]) + 1


MODEL_ASSETS = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
    "generation_config.json", "preprocessor_config.json",
)
"""Files of the run's model directory a checkpoint carries over so that it loads on its own:
the tokenizer (with its chat template) and the generation config."""


def copy_model_assets(src: str | Path | None, dst: Path) -> list[str]:
    """Copy the tokenizer, chat template and generation config of model directory `src` into
    `dst` (files `dst` already has are kept); returns the names copied."""
    if src is None or not Path(src).is_dir():
        return []
    copied = []
    for name in MODEL_ASSETS:
        if (Path(src) / name).is_file() and not (dst / name).exists():
            shutil.copy2(Path(src) / name, dst / name)
            copied.append(name)
    return copied


def write_weights(backend, directory: Path) -> None:
    """The policy's full weights into `directory/model.safetensors` (rank 0 writes; collective: the
    other ranks take part in gathering each bucket), one bucket at a time (`write_safetensors`)."""
    layout = backend.published_layout(None)
    buckets = backend.state_dict_buckets(PUBLISH_BUCKET_BYTES, None)
    try:
        if backend.rank == 0:
            write_safetensors(directory / "model.safetensors", StateBuckets(layout, buckets), metadata={"format": "pt"})
    finally:  # every rank gathers every bucket, whatever became of rank 0's file
        for _ in buckets:
            pass


class CheckpointWriter:
    """Writes checkpoints of a backend's policy and optimizer, off the critical path where the
    backend allows it: the torch backend copies weights and optimizer state to CPU memory (the
    only part the step waits for) and a thread writes the files; DeepSpeed's own checkpoint is
    collective and written before returning. A new checkpoint (and `wait`) first waits for the
    previous one."""

    def __init__(self) -> None:
        self._writer: threading.Thread | None = None

    def save(
        self, backend, root: Path, version: int, keep: int, trainer_state: dict, ema: dict | None, assets_from: str | None, background: bool = True,
        fence: Callable[[], None] | None = None, epoch: int = 0, protect: int | None = None,
    ) -> Path | None:
        """Write the checkpoint of policy version `version` under `root` (collective: every rank
        calls it); returns its directory on rank 0; the oldest beyond `keep` go, except version
        `protect`'s. `trainer_state` and `ema` (CPU tensors) are rank 0's. `fence` (rank
        0's) raises unless this learner still holds its lease, whose `epoch` the manifest records:
        it is called before the checkpoint is renamed into place."""
        self.wait()
        final = step_dir(root, version)
        rank0 = backend.rank == 0
        tmp = None
        if rank0:
            tmp = root / f".{final.name}.e{epoch}.partial-{uuid.uuid4().hex[:8]}"
            tmp.mkdir(parents=True)
        tmp = Path(backend.broadcast_object(str(tmp) if tmp else None))  # the directory exists before anyone writes
        write_optimizer = backend.capture_optimizer()
        state = None
        failed = None
        if write_optimizer is None:  # collective: every rank writes its part now
            try:  # rank 0 streams the HF weights bucket by bucket (ZeRO-3 gathers one at a time)
                write_weights(backend, tmp)
            except Exception as exc:  # noqa: BLE001 — rank 0's file failed; the collectives still line up
                failed = exc
            backend.save(tmp)
        else:  # one process: its weights, copied to CPU memory for the writer thread
            state = {k: v.detach().to("cpu", copy=True) for k, v in backend.full_state_dict().items()}
        if rank0 and failed is not None:  # as a failed background write: no checkpoint this time, the next one retries
            log.error("writing checkpoint %s failed: %s", final, failed)
            shutil.rmtree(tmp, ignore_errors=True)
        elif rank0:
            args = (backend.policy, state, write_optimizer, trainer_state, assets_from, tmp, final, keep, ema, fence, epoch, protect)
            if background and write_optimizer is not None:
                self._writer = threading.Thread(target=_write_checkpoint, args=args, name=f"checkpoint-v{version}")
                self._writer.start()  # not a daemon: a stopping learner finishes the checkpoint
            else:
                _write_checkpoint(*args)
        backend.broadcast_object(None)
        return final if rank0 else None

    def wait(self) -> None:
        """Block until the checkpoint being written in the background (if any) is complete."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None


def _write_checkpoint(
    policy, state, write_optimizer, trainer_state, assets_from, tmp: Path, final: Path, keep: int, ema: dict | None = None,
    fence: Callable[[], None] | None = None, epoch: int = 0, protect: int | None = None,
) -> None:
    """Rank 0's files of a checkpoint into `tmp`, the manifest last; then, if the fence holds and no
    intact checkpoint of the version is there, renamed to `final`; then the oldest beyond `keep`
    go, except version `protect`'s."""
    try:
        if state is not None:
            policy.save_pretrained(tmp, state_dict=state, safe_serialization=True)  # config + generation_config + weights
        else:  # the weights are written (`write_weights`): the rest of what save_pretrained writes
            policy.config.save_pretrained(tmp)
            if getattr(policy, "generation_config", None) is not None:
                policy.generation_config.save_pretrained(tmp)
        copy_model_assets(assets_from, tmp)
        if write_optimizer is not None:
            write_optimizer(tmp)
        if ema is not None:
            save_file(ema, str(tmp / EMA_REFERENCE_FILE))
        (tmp / TRAINER_STATE_FILE).write_text(json.dumps(trainer_state))
        fsync_tree(tmp)  # every file on disk before the manifest that vouches for them
        files = {str(p.relative_to(tmp)): {"bytes": p.stat().st_size, "sha256": sha256_hex(p)} for p in sorted(tmp.rglob("*")) if p.is_file()}
        write_durably(tmp / COMPLETE, json.dumps({"step": trainer_state.get("step"), "policy_version": trainer_state.get("policy_version"), "epoch": epoch, "files": files}))
    except Exception:  # noqa: BLE001 — an incomplete checkpoint is never loaded; the next one retries
        log.exception("writing checkpoint %s failed", final)
        shutil.rmtree(tmp, ignore_errors=True)
        return
    root = final.parent
    if not _publish(tmp, final, fence, epoch):
        shutil.rmtree(tmp, ignore_errors=True)
        return
    kept = final.name if protect is None else step_dir(root, protect).name
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep]:
        if old.name != kept:
            shutil.rmtree(old, ignore_errors=True)
    _remove_leftovers(root, keep=tmp)
    # a checkpoint at this shape exists now: the universal conversion a resume at it started from goes
    shutil.rmtree(root.parent / "universal", ignore_errors=True)


def _publish(tmp: Path, final: Path, fence: Callable[[], None] | None, epoch: int) -> bool:
    """Rename the written checkpoint `tmp` to `final`, fenced; False if it was not. An intact
    checkpoint of the step written under this epoch or a newer one is kept; one of an older epoch
    (a learner that lost its lease before committing the step) or a damaged one is replaced."""
    if final.exists():
        why, theirs = verify(final), _epoch(final)
        if why is None and theirs is not None and theirs >= epoch:
            log.warning("checkpoint %s exists and is intact (epoch %s): kept, this learner's copy (epoch %d) dropped", final.name, theirs, epoch)
            return False
    try:
        if fence is not None:
            fence()  # last, right before the renames: the window a pause could slip through is two renames wide
    except Exception as exc:  # noqa: BLE001 — LeaseLost, RedisLostData, Redis away: not this learner's to write
        log.error("checkpoint %s not written: this learner (epoch %d) may no longer write (%s)", final.name, epoch, exc)
        return False
    if final.exists():
        log.warning("checkpoint %s (epoch %s) replaced by this learner's (epoch %d): %s", final.name, _epoch(final), epoch, verify(final) or "an older epoch's")
        doomed = final.parent / f".{final.name}.damaged-{uuid.uuid4().hex[:8]}"
        os.rename(final, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    try:
        os.rename(tmp, final)  # refused if another writer's checkpoint landed meanwhile (a non-empty directory)
    except OSError as exc:
        log.warning("checkpoint %s appeared meanwhile (%s): this learner's copy dropped", final.name, exc)
        return False
    fsync_path(final.parent)
    return True


def _remove_leftovers(root: Path, keep: Path) -> None:
    """Hidden directories a killed writer left (a checkpoint cut short, one moved aside): every one
    but `keep`, once its writer is gone (an hour old, as the weights' partial directories)."""
    for d in root.glob(".step-*"):
        if d != keep and d.is_dir() and (".partial-" in d.name or ".damaged-" in d.name) and time.time() - d.stat().st_mtime > 3600:
            shutil.rmtree(d, ignore_errors=True)


def _epoch(directory: Path) -> int | None:
    try:
        return json.loads((directory / COMPLETE).read_text()).get("epoch")
    except (OSError, ValueError, AttributeError):
        return None


def checkpoint_versions(root: Path) -> dict[int, Path]:
    """{policy version: directory} of the complete checkpoints under `root` (not verified: one
    whose trainer state is unreadable is listed under its name's number, for `verify` to refuse)."""
    found: dict[int, Path] = {}
    for marker in sorted(root.glob(f"step-*/{COMPLETE}")):
        try:
            version = version_of(marker.parent)
            if version not in found or found[version].name != checkpoint_name(version):
                found[version] = marker.parent  # a checkpoint named by its version wins over an older one holding it
        except (OSError, ValueError, KeyError, TypeError):
            try:
                found.setdefault(int(marker.parent.name.removeprefix("step-")), marker.parent)
            except ValueError:
                continue  # not a name this learner writes
    return found


def latest_checkpoint(root: Path, version: int | None = None) -> Path | None:
    """The newest complete, intact checkpoint under `root` (of policy version `version` exactly, if
    given): each file hashed against its manifest (`verify`); a damaged one is skipped, with a
    warning saying why."""
    found = checkpoint_versions(root)
    done = [found[v] for v in sorted(found, reverse=True) if version is None or v == version]
    for d in done:
        why = verify(d)
        if why is None:
            return d
        log.warning("checkpoint %s is unreadable (%s): skipped", d, why)
    return None


def unusable(directory: Path) -> str | None:
    """Why checkpoint `directory` cannot be used, in words for a user (incomplete, or `verify`),
    or None: what `magic export` and `magic eval --local` refuse a checkpoint for."""
    if not (directory / COMPLETE).is_file():
        return f"it is incomplete (no {COMPLETE} marker: its write was cut short)"
    if (why := verify(directory)) is not None:
        return f"it is unreadable ({why})"
    return None


def verify(directory: Path) -> str | None:
    """Why checkpoint `directory` cannot be trusted, or None: `problem`, a file on disk its manifest
    does not list, or a file whose SHA-256 is not its manifest's (hashes every file: seconds per GB).
    A manifest of sizes only (written before digests) is checked by size, with a warning."""
    if (why := problem(directory)) is not None:
        return why
    try:
        manifest = json.loads((directory / COMPLETE).read_text())
        on_disk = {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and p.name != COMPLETE}
        if extra := sorted(on_disk - set(manifest["files"])):
            return f"{extra[0]} is in the directory but not in its {COMPLETE} manifest (added after it was written)"
        legacy = [name for name, entry in manifest["files"].items() if not isinstance(entry, dict) or "sha256" not in entry]
        if legacy:
            log.warning("checkpoint %s has no digests (written before MAGIC recorded them): checked by size only", directory)
        for name, entry in manifest["files"].items():
            if name not in legacy and sha256_hex(directory / name) != entry["sha256"]:
                return f"{name} does not match its SHA-256 in {COMPLETE} (its bytes changed after it was written)"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def problem(directory: Path) -> str | None:
    """Why checkpoint `directory` cannot be loaded, or None: no manifest, a file it lists is
    missing or has another size (a write cut short), the weights' safetensors header or the trainer
    state does not parse. Cheap: nothing is hashed or loaded (`verify` hashes)."""
    try:
        manifest = json.loads((directory / COMPLETE).read_text() or "{}")
        files = manifest.get("files")
        if not isinstance(files, dict) or not files:
            return f"{COMPLETE} lists no files"
        for name, entry in files.items():
            size = entry.get("bytes") if isinstance(entry, dict) else entry
            path = directory / name
            if Path(name).is_absolute() or ".." in Path(name).parts or not path.is_file() or path.stat().st_size != size:
                return f"{name} is missing or has {path.stat().st_size if path.is_file() else 0} bytes, not {size}"
        state = read_trainer_state(directory)
        if not isinstance(state.get("step"), int) or "entropy_controller" not in state:
            return f"{TRAINER_STATE_FILE} lacks the step or the entropy controller"
        weights = sorted(directory.glob("model*.safetensors"))
        if not weights:
            return "no model.safetensors"
        for w in weights:
            with safe_open(str(w), framework="pt") as f:
                f.keys()
    except (OSError, ValueError, KeyError, TypeError, AttributeError, SafetensorError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def read_trainer_state(directory: Path) -> dict:
    """The checkpoint's trainer state: {"step": k (the last step trained), "policy_version": k + 1,
    "entropy_controller": {...}, "shape": {...}}."""
    return json.loads((directory / TRAINER_STATE_FILE).read_text())


def read_ema_reference(directory: Path) -> dict | None:
    """The EMA reference policy's weights of the checkpoint, or None if it has none."""
    path = directory / EMA_REFERENCE_FILE
    return load_file(str(path)) if path.exists() else None


# -- resuming at another shape ------------------------------------------------------------------


class ResumeShapeError(RuntimeError):
    """A checkpoint this learner cannot resume at its shape (the run fails with what to do)."""


def shape_of(backend) -> dict:
    """What a checkpoint records of the learner that wrote it (trainer_state.json's "shape")."""
    return {
        "backend": "deepspeed" if hasattr(backend, "engine") else "torch",
        "world_size": backend.world_size,
        "zero_stage": getattr(backend, "zero_stage", None),
        "precision": getattr(backend, "precision", None),
    }


def saved_shape(directory: Path) -> dict:
    """The shape that wrote checkpoint `directory`: recorded in trainer_state.json, or (checkpoints
    written before it was) read from its files: DeepSpeed's per-rank optimizer files, or optimizer.pt."""
    state = json.loads((directory / TRAINER_STATE_FILE).read_text())
    if isinstance(state.get("shape"), dict):
        return state["shape"]
    ds = directory / "deepspeed"
    if ds.is_dir():
        optim = list(ds.glob("*zero_pp_rank_*_mp_rank_00_optim_states.pt"))
        return {
            "backend": "deepspeed",
            "world_size": len(optim),
            "zero_stage": 3 if (ds / "zero_pp_rank_0_mp_rank_00_model_states.pt").is_file() else 2,  # 1 and 2 name their files alike
            "precision": "bf16" if any(p.name.startswith("bf16_") for p in optim) else "fp32",
        }
    return {"backend": "torch", "world_size": 1, "zero_stage": None, "precision": None}


def resume_mode(saved: dict, now: dict) -> str:
    """"same": load the checkpoint as written; "universal": DeepSpeed written at another world
    size, ZeRO stage or precision, loaded through DeepSpeed's universal checkpoint format (each
    parameter's float32 master and AdamW moments whole, re-partitioned for the new shape). Raises
    ResumeShapeError for a change of backend (torch <-> DeepSpeed), saying what to do."""
    if saved["backend"] != now["backend"]:
        raise ResumeShapeError(
            f"the checkpoint was written by the {saved['backend']} backend ({saved['world_size']} rank(s)) and this learner runs "
            f"the {now['backend']} backend ({now['world_size']} rank(s)): their optimizer states do not convert. Resume with "
            f"{'MAGIC_BACKEND=torch on one rank (learner.gpus 1, nodes 1)' if saved['backend'] == 'torch' else 'MAGIC_BACKEND=deepspeed (learner.gpus > 1 or nodes > 1)'}, "
            "or start a new run from the checkpoint's weights (its model.safetensors loads as a model)"
        )
    if now["backend"] == "torch":
        return "same"
    changed = [k for k in ("world_size", "zero_stage", "precision") if saved.get(k) is not None and saved[k] != now[k]]
    return "universal" if changed else "same"


UNIVERSAL_COMPLETE = "UNIVERSAL_COMPLETE"


def _complete_optimizer_state(zero: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    """What each ZeRO stage's universal loader reads and the other stage's conversion leaves out:
    from ZeRO-1/2, `optimizer_state_dict` (AdamW's step and hyperparameters) for ZeRO-3; from
    ZeRO-3, the DeepSpeed version, each parameter's `step.pt`, and its states as {"param": tensor
    of the parameter's shape} (`shapes`: the checkpoint's weights, by name) for ZeRO-1/2."""
    import deepspeed
    import torch

    path = zero / "optimizer_state.pt"
    sd = torch.load(path, weights_only=False)
    params = [d for d in zero.iterdir() if d.is_dir()]
    steps = sorted(zero.glob("*/step.pt"))
    changed = False
    if "optimizer_state_dict" not in sd and steps and "param_groups" in sd:
        step = torch.load(steps[0], weights_only=False)
        sd["optimizer_state_dict"] = {"state": {0: {"step": step}}, "param_groups": [dict(g) for g in sd["param_groups"]]}
        changed = True
    if "optimizer_state_dict" in sd and not steps:
        step = sd["optimizer_state_dict"]["state"][0]["step"]
        for d in params:
            torch.save(torch.as_tensor(step, dtype=torch.float32).clone(), d / "step.pt")
    if not sd.get("ds_version"):
        sd["ds_version"] = deepspeed.__version__
        changed = True
    if "param_groups" not in sd and "optimizer_state_dict" in sd:
        sd["param_groups"] = sd["optimizer_state_dict"]["param_groups"]
        changed = True
    if changed:
        torch.save(sd, path)
    for d in params:
        shape = shapes.get(d.name.split(".", 1)[1] if "." in d.name else d.name)
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            f = d / f"{key}.pt"
            if not f.is_file():
                continue
            t = torch.load(f, weights_only=False)
            if isinstance(t, torch.Tensor):
                if shape is None or t.numel() != math.prod(shape):
                    raise ValueError(f"universal checkpoint: {d.name}/{key}.pt has {t.numel()} elements, the weights make it {shape}")
                torch.save({"param": t.reshape(shape)}, f)


def to_universal(directory: Path, out: Path) -> Path:
    """DeepSpeed's universal checkpoint of checkpoint `directory` under `out` (converted once:
    `out` is reused while its marker is there; other conversions beside it are removed). Run on
    one process (rank 0)."""
    import argparse

    from deepspeed.checkpoint import ds_to_universal

    if (out / UNIVERSAL_COMPLETE).is_file() and json.loads((out / UNIVERSAL_COMPLETE).read_text()).get("source") == str(directory.resolve()):
        return out
    for old in out.parent.glob("*") if out.parent.is_dir() else []:
        if old != out:
            shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    args = argparse.Namespace(
        input_folder=str(directory / "deepspeed"), output_folder=str(out / "deepspeed"), num_extract_workers=1, num_merge_workers=1,
        keep_temp_folder=False, strict=True, inject_missing_state=True,
    )
    ds_to_universal.main(args)
    weights = SafetensorsFile(directory / "model.safetensors")
    _complete_optimizer_state(out / "deepspeed" / "zero", {k: weights.shape(k) for k in weights.keys()})
    # The engine reads the run's metadata (steps, client state) from the model-states file, named
    # after the ZeRO stage that loads it: give both names, so ZeRO-1/2 <-> ZeRO-3 resumes.
    folder = out / "deepspeed"
    names = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")
    present = [n for n in names if (folder / n).is_file()]
    for n in names:
        if present and not (folder / n).exists():
            shutil.copy2(folder / present[0], folder / n)
    write_durably(out / UNIVERSAL_COMPLETE, json.dumps({"source": str(directory.resolve())}))
    log.info("converted checkpoint %s to DeepSpeed's universal format in %.1f s (%s)", directory, time.perf_counter() - t0, out)
    return out
