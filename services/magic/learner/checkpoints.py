"""Checkpoints of the learner: a directory per step that loads as a Hugging Face model on its own.

Layout: root/step-<k>/ {config.json, generation_config.json, model.safetensors (HF format; the
float32 master weights), the tokenizer and chat template of the run's model, optimizer.pt or
deepspeed/ (partitioned state), ema_reference.safetensors (with an EMA reference),
trainer_state.json, COMPLETE}: the directory loads as it is with `from_pretrained` and `vllm serve`.
COMPLETE is written last, once every file is fsynced, and lists each file's size; a checkpoint
without it, or whose files do not match it or do not parse (`problem`: a write cut short by a
crash or a power cut), is never loaded. The oldest beyond `keep` are deleted.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from magic.runtime.files import fsync_tree, write_durably

log = logging.getLogger(__name__)

EMA_REFERENCE_FILE = "ema_reference.safetensors"
"""The EMA reference policy's weights in a checkpoint (present when a stage used one)."""
TRAINER_STATE_FILE = "trainer_state.json"
"""The step and the entropy controller's state."""
COMPLETE = "COMPLETE"
"""Written last: a checkpoint without it is never loaded."""


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


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


class CheckpointWriter:
    """Writes checkpoints of a backend's policy and optimizer, off the critical path where the
    backend allows it: the torch backend copies weights and optimizer state to CPU memory (the
    only part the step waits for) and a thread writes the files; DeepSpeed's own checkpoint is
    collective and written before returning. A new checkpoint (and `wait`) first waits for the
    previous one."""

    def __init__(self) -> None:
        self._writer: threading.Thread | None = None

    def save(
        self, backend, root: Path, step: int, keep: int, trainer_state: dict, ema: dict | None, assets_from: str | None, background: bool = True
    ) -> Path | None:
        """Write checkpoint `step` under `root` (collective: every rank calls it); returns its
        directory on rank 0. `trainer_state` and `ema` (CPU tensors) are rank 0's."""
        self.wait()
        d = step_dir(root, step)
        rank0 = backend.rank == 0
        if rank0:
            if d.exists():
                shutil.rmtree(d)
            d.mkdir(parents=True)
        backend.broadcast_object(None)  # the directory exists before anyone writes
        state = backend.full_state_dict()
        write_optimizer = backend.capture_optimizer()
        if write_optimizer is None:  # collective: every rank writes its part now
            backend.save(d)
        if rank0:
            state = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
            args = (backend.policy, state, write_optimizer, trainer_state, assets_from, d, root, keep, ema)
            if background and write_optimizer is not None:
                self._writer = threading.Thread(target=_write_checkpoint, args=args, name=f"checkpoint-{step}")
                self._writer.start()  # not a daemon: a stopping learner finishes the checkpoint
            else:
                _write_checkpoint(*args)
        backend.broadcast_object(None)
        return d if rank0 else None

    def wait(self) -> None:
        """Block until the checkpoint being written in the background (if any) is complete."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None


def _write_checkpoint(policy, state, write_optimizer, trainer_state, assets_from, d: Path, root: Path, keep: int, ema: dict | None = None) -> None:
    """Rank 0's files of a checkpoint, COMPLETE last; then the oldest checkpoints beyond `keep` go."""
    try:
        policy.save_pretrained(d, state_dict=state, safe_serialization=True)  # config + generation_config + weights
        copy_model_assets(assets_from, d)
        if write_optimizer is not None:
            write_optimizer(d)
        if ema is not None:
            save_file(ema, str(d / EMA_REFERENCE_FILE))
        (d / TRAINER_STATE_FILE).write_text(json.dumps(trainer_state))
        fsync_tree(d)  # every file on disk before the marker that vouches for them
        sizes = {str(p.relative_to(d)): p.stat().st_size for p in sorted(d.rglob("*")) if p.is_file()}
        write_durably(d / COMPLETE, json.dumps({"step": trainer_state.get("step"), "files": sizes}))
    except Exception:  # noqa: BLE001 — an incomplete checkpoint is never loaded; the next one retries
        log.exception("writing checkpoint %s failed", d)
        return
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(root: Path, step: int | None = None) -> Path | None:
    """The newest complete, readable checkpoint under `root` (of `step` exactly, if given); an
    unreadable one (`problem`) is skipped, with a warning."""
    done = sorted((p.parent for p in root.glob(f"step-*/{COMPLETE}")), reverse=True)
    if step is not None:
        done = [p for p in done if p.name == f"step-{step:08d}"]
    for d in done:
        why = problem(d)
        if why is None:
            return d
        log.warning("checkpoint %s is unreadable (%s): skipped", d, why)
    return None


def unusable(directory: Path) -> str | None:
    """Why checkpoint `directory` cannot be used, in words for a user (incomplete, or `problem`),
    or None: what `magic export` and `magic eval --local` refuse a checkpoint for."""
    if not (directory / COMPLETE).is_file():
        return f"it is incomplete (no {COMPLETE} marker: its write was cut short)"
    if (why := problem(directory)) is not None:
        return f"it is unreadable ({why})"
    return None


def problem(directory: Path) -> str | None:
    """Why checkpoint `directory` cannot be loaded, or None: a file its marker lists is missing or
    has another size (a write cut short), the weights' safetensors header or the trainer state
    does not parse. Cheap: nothing is hashed or loaded."""
    try:
        manifest = json.loads((directory / COMPLETE).read_text() or "{}")
        for name, size in (manifest.get("files") or {}).items():
            path = directory / name
            if not path.is_file() or path.stat().st_size != size:
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
    """The checkpoint's trainer state: {"step": k, "entropy_controller": {...}}."""
    return json.loads((directory / TRAINER_STATE_FILE).read_text())


def read_ema_reference(directory: Path) -> dict | None:
    """The EMA reference policy's weights of the checkpoint, or None if it has none."""
    path = directory / EMA_REFERENCE_FILE
    return load_file(str(path)) if path.exists() else None
