"""The vLLM virtualenv for the tests that run a real vLLM (`make vllm-venv`, `.venv-vllm`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from magic.rollout.vllm_server import default_python

VLLM_PYTHON = Path(os.environ.get("MAGIC_VLLM_PYTHON") or default_python())
"""Its interpreter: MAGIC_VLLM_PYTHON, else `<repo>/.venv-vllm/bin/python`."""


def require_vllm() -> None:
    """Skip without the vLLM virtualenv — fail in CI, where `make test` creates it."""
    if VLLM_PYTHON.exists():
        return
    reason = f"no vLLM virtualenv at {VLLM_PYTHON}: run `make vllm-venv`"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(reason + " (CI runs the real-vLLM tests: `make test` creates it)", pytrace=False)
    pytest.skip(reason)
