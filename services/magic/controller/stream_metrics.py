"""Samples a run's streams and live workers into the system gauges of the "MAGIC / System" dashboard.

    magic_stream_length{stream}    XLEN of each run stream (the dead-letter stream included)
    magic_stream_pending{stream}   entries delivered to the consumer group but not acknowledged
    magic_stream_lag{stream}       entries not yet delivered to the consumer group
    magic_live_workers{service}    workers of each service with a fresh heartbeat on this run

The step driver calls `StreamSampler.maybe_sample()` from its wait loops; a call does Redis work
at most once per `interval` seconds (`RunChannels.stream_stats`: one pipeline of XLEN + XINFO GROUPS).
"""

from __future__ import annotations

import time

from magic.observability import metrics as m
from magic.store.channels import RunChannels

STREAMS = ("prompts", "rollouts", "scored", "weights", "events", "dead")
"""The run streams by their short name (the `stream` label); `weights` and `dead` have no consumer group."""
SERVICES = ("rollout", "reward", "learner")


class StreamSampler:
    def __init__(self, channels: RunChannels, interval: float = 1.0):
        self.channels = channels
        self.interval = interval
        self._last = float("-inf")

    def maybe_sample(self) -> bool:
        """Sample if `interval` has passed since the last sample; returns whether it sampled."""
        now = time.monotonic()
        if now - self._last < self.interval:
            return False
        self._last = now
        self.sample()
        return True

    def sample(self) -> None:
        for name, (length, pending, lag) in self.channels.stream_stats(STREAMS).items():
            m.STREAM_LENGTH.labels(stream=name).set(length)
            if pending is None:
                continue  # no such stream yet, or a stream read without a consumer group
            m.STREAM_PENDING.labels(stream=name).set(pending)
            if lag is not None:  # Redis reports no lag after deletions it cannot account for
                m.STREAM_LAG.labels(stream=name).set(lag)
        for service in SERVICES:
            m.LIVE_WORKERS.labels(service=service).set(len(self.channels.alive(service)))
