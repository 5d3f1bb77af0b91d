"""Child processes that never outlive the process that started them."""

from __future__ import annotations

import ctypes
import signal

try:  # resolved here, in the parent: a `preexec_fn` must not import or load anything after fork
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the parent's cleanup is all there is
    _prctl = None

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """In a child (a `preexec_fn`, or its own first call): receive `sig` when the parent dies, even
    by SIGKILL (Linux PR_SET_PDEATHSIG). It fires when the parent's *thread* that forked the child
    exits, so fork from a thread that lives as long as the parent (the main thread)."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, int(sig))
