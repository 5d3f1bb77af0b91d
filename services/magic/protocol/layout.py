"""Names on the shared volume that more than one component reads: the learner writes them; the
controller's API, `magic export` and `magic eval --local` name or find them."""

from __future__ import annotations

from pathlib import Path

CHECKPOINT_MANIFEST = "COMPLETE"
"""The file a checkpoint directory is complete with (written last: every file's size and digest)."""


def checkpoint_root(run_dir: Path) -> Path:
    """Where a run's checkpoints are: DATA_DIR/runs/<run>/checkpoints/ for `run_dir` DATA_DIR/runs/<run>."""
    return run_dir / "checkpoints"


def checkpoint_name(version: int) -> str:
    """The directory of the checkpoint of policy version `version` (the policy after `version`
    training steps) under DATA_DIR/runs/<run>/checkpoints/.

    >>> checkpoint_name(200)
    'step-00000200'
    """
    return f"step-{version:08d}"
