"""The reward worker: rollout groups in, one score per sample out.

    loop:
        pull rollout groups (reclaiming those of dead reward workers)
        score every sample: reward = 1 if the verifier says correct else 0
        publish the scored group, then acknowledge the rollout entry

A sample whose verification fails gets an ERROR verdict and reward 0; it never fails the group.
"""

from __future__ import annotations

import logging
import time

import redis

from magic.common import codec, keys
from magic.common.bus import ConsumerGroup, Entry, Stream
from magic.common.config import RewardSettings
from magic.common.heartbeat import alive_workers
from magic.common.metrics import REWARD_LATENCY, REWARD_VERDICTS
from magic.common.pb import messages_pb2 as pb
from magic.common.service import Worker
from magic.reward import math_verifier

log = logging.getLogger(__name__)

SERVICE = "reward"
GROUP = "reward"


def score_sample(data_source: str, response: str, ground_truth: str, timeout_seconds: float) -> pb.Score:
    """Score one response. Every data source is judged as a math answer for now."""
    v = math_verifier.verify(response, ground_truth, timeout_seconds=max(1, int(timeout_seconds)))
    correct = 1.0 if v.correct else 0.0
    verdict_name = pb.Verdict.Name(v.verdict).removeprefix("VERDICT_").lower()
    REWARD_LATENCY.labels(kind="math").observe(v.seconds)
    REWARD_VERDICTS.labels(kind="math", verdict=verdict_name).inc()
    return pb.Score(reward=correct, correctness=correct, verdict=v.verdict, details=f"answer={v.answer[:80]!r}", seconds=v.seconds)


class RewardWorker(Worker):
    def __init__(self, r: redis.Redis, run_id: str, settings: RewardSettings):
        self.r = r
        self.settings = settings
        self.keys = keys.RunKeys(run_id)
        self.name = settings.worker_name
        self.rollouts = ConsumerGroup(r, self.keys.rollouts, GROUP, self.name, dead_stream=self.keys.dead, max_deliveries=settings.max_deliveries)
        self.rollouts.ensure()
        self.scored = Stream(r, self.keys.scored)
        self._last_reclaim = 0.0
        self.groups_scored = 0

    def status(self) -> dict:
        return {"groups_scored": self.groups_scored}

    def poll(self) -> None:
        entries = self._reclaim() or self.rollouts.read(count=16, block_ms=500)
        for entry in entries:
            group = self.rollouts.decode(entry, pb.RolloutGroup)
            if group is not None:
                self.score(entry, group)

    def score(self, entry: Entry, group: pb.RolloutGroup) -> None:
        p = group.prompt
        out = pb.ScoredGroup(rollout=group, worker=self.name)
        for s in group.samples:
            out.scores.append(score_sample(p.data_source, s.text, p.ground_truth, self.settings.verify_timeout_seconds))
        pipe = self.r.pipeline(transaction=True)  # publish + ack atomically (same hash slot)
        pipe.xadd(self.scored.key, codec.encode(out))
        pipe.xack(self.rollouts.stream, GROUP, entry.id)
        pipe.execute()
        self.groups_scored += 1

    def _reclaim(self) -> list[Entry]:
        now = time.time()
        if now - self._last_reclaim < self.settings.heartbeat_ttl_seconds / 2:
            return []
        self._last_reclaim = now
        return self.rollouts.reclaim(alive_workers(self.r, SERVICE))


def run(settings: RewardSettings | None = None) -> int:
    from magic.common.service import serve

    settings = settings or RewardSettings()
    return serve(SERVICE, settings, lambda r, run_id: RewardWorker(r, run_id, settings))
