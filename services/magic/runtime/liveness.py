"""Liveness from the main loop's progress, not from a thread that is always fine.

A process is *live* while its main loop keeps coming round: the loop calls `beat()` each time it
finishes a unit of work (a poll, a command, an idle wait). /livez answers 503 — and the
Kubernetes liveness probe restarts the container — once the loop has not come round for
`stall_seconds`: a learner blocked in a weight broadcast whose peer is gone, a rollout worker
stuck on a dead vLLM socket, a deadlock. An operation known to be long and known to end (loading
a model when attaching to a run, waiting for rank 0's next command) is wrapped in
`allowing(seconds, what)`: it may take up to that long before the process counts as hung.

The Redis heartbeat (`magic.store.heartbeat`) asks the same question before it beats, so a hung
worker also stops counting as a live worker for the controller and its peers reclaim its entries.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class LoopWatch:
    """When the main loop last made progress, and whether that is too long ago."""

    def __init__(self, stall_seconds: float, clock: Callable[[], float] = time.monotonic):
        if stall_seconds <= 0:
            raise ValueError(f"stall_seconds must be > 0, not {stall_seconds}")
        self.stall_seconds = stall_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._last = clock()
        self._allowed: tuple[float, float, str] | None = None  # (started, seconds, what)

    def beat(self) -> None:
        """The loop came round."""
        with self._lock:
            self._last = self._clock()

    @contextmanager
    def allowing(self, seconds: float, what: str) -> Iterator[None]:
        """Run a long operation that may take up to `seconds` (instead of `stall_seconds`); the
        loop counts as having made progress when it ends, however it ends."""
        with self._lock:
            outer, self._allowed = self._allowed, (self._clock(), seconds, what)
        try:
            yield
        finally:
            with self._lock:
                self._allowed = outer
                self._last = self._clock()

    def stalled(self) -> str | None:
        """None while the loop is live; otherwise why it is not (the /livez answer)."""
        with self._lock:
            now = self._clock()
            if self._allowed is not None:
                started, seconds, what = self._allowed
                if now - started <= seconds:
                    return None
                return f"{what} has taken {now - started:.0f} s, over its {seconds:g} s"
            idle = now - self._last
            if idle <= self.stall_seconds:
                return None
            return f"the main loop has made no progress for {idle:.0f} s (limit {self.stall_seconds:g} s)"
