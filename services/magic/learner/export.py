"""`magic export`: a run's checkpoint as a Hugging Face model directory that transformers and vLLM load as is.

A learner checkpoint (`checkpoints.py`) already loads with `from_pretrained` and `vllm serve`,
but it also carries the training state (optimizer, DeepSpeed partitions, the EMA reference, the
trainer state, the COMPLETE marker) — gigabytes a served model does not need and files a model
hub should not get. The export copies only the model: config.json, the weights as safetensors
(one file or shards with their index, as the learner wrote them), generation_config.json, the
tokenizer and chat template. `dtype` converts the floating-point weights (the learner keeps
float32 master weights; bfloat16 halves the files, as the models are usually served) and sets
config.json's dtype to match.

The checkpoint is found under DATA_DIR/runs/<run>/checkpoints/step-<K> (the policy after K steps,
policy version K: `checkpoints`' one numbering); only a complete one whose
files match its marker (`checkpoints.problem`) is exported. The output is written to a temporary
sibling and renamed into place, so a cut-short export never looks like a model.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from magic.learner.checkpoints import MODEL_ASSETS, checkpoint_versions, unusable
from magic.protocol.layout import checkpoint_name
from magic.protocol.layout import checkpoint_root as run_checkpoint_root

LOCAL_DATA_DIR = ".magic/local/data"
"""The data directory of `magic local`'s default --out (.magic/local)."""
DTYPES = ("float32", "bfloat16", "float16")
"""The dtypes the weights can be exported in (None: as stored)."""


class ExportError(ValueError):
    """A run, step or checkpoint that cannot be exported (the message names what is available)."""


def checkpoint_root(data_dir: str | Path, run: str) -> Path:
    return run_checkpoint_root(Path(data_dir) / "runs" / run)


def available_steps(root: Path) -> list[int]:
    """The steps K (= policy versions: the weights after K steps) of the complete checkpoints
    under `root` (their COMPLETE marker written), ascending."""
    return sorted(checkpoint_versions(root))


def find_checkpoint(data_dir: str | Path, run: str, step: int | None) -> Path:
    """The checkpoint directory of `run` after `step` steps (None: the newest complete one)."""
    root = checkpoint_root(data_dir, run)
    if not (Path(data_dir) / "runs" / run).is_dir():
        runs = sorted(p.name for p in (Path(data_dir) / "runs").glob("*") if p.is_dir())
        hint = ""
        for other in (LOCAL_DATA_DIR,):  # where `magic local` keeps its runs (its --out's data/)
            if Path(other).resolve() != Path(data_dir).resolve() and (Path(other) / "runs" / run).is_dir():
                hint = f"; `magic local` wrote a run {run!r} under {other}: pass --data-dir {other}"
        raise ExportError(f"no run {run!r} under {Path(data_dir) / 'runs'} (runs with a directory there: {', '.join(runs) or 'none'}){hint}")
    steps = available_steps(root)
    listing = f"complete checkpoints of run {run!r}: steps {', '.join(map(str, steps))}" if steps else f"run {run!r} has no complete checkpoint under {root}"
    if step is None:
        if not steps:
            raise ExportError(listing)
        step = steps[-1]
    d = checkpoint_versions(root).get(step)
    if d is None:
        cut = root / checkpoint_name(step)
        if cut.is_dir() and (why := unusable(cut)) is not None:
            raise ExportError(f"the checkpoint of step {step}: {why}; {listing}")
        raise ExportError(f"the checkpoint of step {step} does not exist; {listing}")
    if (why := unusable(d)) is not None:
        raise ExportError(f"the checkpoint of step {step}: {why}; {listing}")
    return d


def export_checkpoint(checkpoint: Path, out: Path, dtype: str | None = None, overwrite: bool = False) -> list[str]:
    """Write the model of `checkpoint` to `out` as a Hugging Face model directory; returns the
    names of the files written."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} is a file: --out names the model directory to write (--force replaces a directory, never a file)")
    if out.exists() and not overwrite:
        raise ExportError(f"{out} exists: choose another directory or pass --force to replace it")
    parent = out.resolve().parent
    if not parent.is_dir():
        raise ExportError(f"{out}: its parent directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ExportError(f"{out}: its parent directory {parent} is not writable")
    tmp = out.with_name(f".{out.name}.exporting")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
    except OSError as exc:
        raise ExportError(f"{out}: cannot write there ({exc.strerror})") from None
    try:
        config = json.loads((checkpoint / "config.json").read_text())
        weights = sorted(checkpoint.glob("model*.safetensors"))
        index = checkpoint / "model.safetensors.index.json"
        total = 0
        for w in weights:
            if dtype is None:
                shutil.copy2(w, tmp / w.name)
                continue
            target = getattr(torch, dtype)
            with safe_open(str(w), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            tensors = {k: v.to(target) if v.is_floating_point() else v for k, v in tensors.items()}
            total += sum(v.numel() * v.element_size() for v in tensors.values())
            save_file(tensors, str(tmp / w.name), metadata={**meta, "format": "pt"})
        if index.is_file():
            doc = json.loads(index.read_text())
            if dtype is not None:
                doc.setdefault("metadata", {})["total_size"] = total
            (tmp / index.name).write_text(json.dumps(doc, indent=2))
        if dtype is not None:
            for key in [k for k in ("torch_dtype", "dtype") if k in config] or ["torch_dtype"]:
                config[key] = dtype
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for name in MODEL_ASSETS:
            if (checkpoint / name).is_file():
                shutil.copy2(checkpoint / name, tmp / name)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except OSError as exc:  # a full or read-only disk, a path that went away: said, not a traceback
        shutil.rmtree(tmp, ignore_errors=True)
        raise ExportError(f"{out}: the export could not be written ({type(exc).__name__}: {exc})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(p.name for p in out.iterdir())
