"""Samples a run's streams and live workers into the system gauges of the "MAGIC / System" dashboard.

    magic_stream_length{stream}    XLEN of each run stream (the dead-letter stream included)
    magic_stream_pending{stream}   entries delivered to the consumer group but not acknowledged
    magic_stream_lag{stream}       entries not yet delivered to the consumer group
    magic_live_workers{service}    workers of each service with a fresh heartbeat on this run

The step driver calls `StreamSampler.maybe_sample()` from its wait loops; a call does Redis work
at most once per `interval` seconds (one pipeline of XLEN + XINFO GROUPS per stream).
"""

from __future__ import annotations

import time

import redis

from magic.common import keys, metrics as m
from magic.common.heartbeat import alive_workers

STREAMS = ("prompts", "rollouts", "scored", "weights", "events", "dead")
"""The run streams by their short name (the `stream` label); `weights` and `dead` have no consumer group."""
SERVICES = ("rollout", "reward", "learner")


class StreamSampler:
    def __init__(self, r: redis.Redis, run_id: str, interval: float = 1.0):
        self.r = r
        self.run_id = run_id
        self.keys = keys.RunKeys(run_id)
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
        pipe = self.r.pipeline(transaction=False)
        for name in STREAMS:
            key = getattr(self.keys, name)
            pipe.xlen(key)
            pipe.xinfo_groups(key)
        replies = pipe.execute(raise_on_error=False)
        for i, name in enumerate(STREAMS):
            length, groups = replies[2 * i], replies[2 * i + 1]
            m.STREAM_LENGTH.labels(stream=name).set(0 if isinstance(length, Exception) else int(length))
            if isinstance(groups, Exception) or not groups:
                continue  # no such stream yet, or a stream read without a consumer group
            m.STREAM_PENDING.labels(stream=name).set(sum(int(g["pending"]) for g in groups))
            lags = [g.get("lag") for g in groups]
            if all(lag is not None for lag in lags):  # Redis reports no lag after deletions it cannot account for
                m.STREAM_LAG.labels(stream=name).set(sum(int(lag) for lag in lags))
        for service in SERVICES:
            live = [n for n, s in alive_workers(self.r, service).items() if s.get("run") == self.run_id]
            m.LIVE_WORKERS.labels(service=service).set(len(live))
