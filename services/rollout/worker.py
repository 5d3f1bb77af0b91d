"""The rollout worker: prompt groups in, sampled groups out, always at the prompt's policy version.

    loop:
        follow the `weights` stream; load any newer version, record it, announce WeightsLoaded
        pull prompt groups (whichever worker is free takes them)
        if a group needs a newer version than we have: wait for it (the entry stays pending)
        if a group asks for an older version: it is stale — never generate it with other weights
        generate gs samples per group, publish to `rollouts`, then acknowledge the prompts
"""

from __future__ import annotations

import logging
import time

import redis

from magic.common import codec, keys
from magic.common.bus import ConsumerGroup, Entry, Stream
from magic.common.config import RolloutSettings, RunSpec
from magic.common.heartbeat import alive_workers
from magic.common.metrics import ERRORS, ROLLOUT_GENERATION_SECONDS, ROLLOUT_TOKENS, WEIGHT_LOAD_SECONDS
from magic.common.pb import messages_pb2 as pb
from magic.common.service import Worker
from magic.rollout.engine import GenerationRequest, RolloutEngine, TorchEngine

log = logging.getLogger(__name__)

SERVICE = "rollout"
GROUP = "rollout"


class RolloutWorker(Worker):
    def __init__(self, r: redis.Redis, run_id: str, settings: RolloutSettings, engine: RolloutEngine):
        self.r = r
        self.run_id = run_id
        self.settings = settings
        self.engine = engine
        self.keys = keys.RunKeys(run_id)
        self.name = settings.worker_name
        self.prompts = ConsumerGroup(r, self.keys.prompts, GROUP, self.name, dead_stream=self.keys.dead, max_deliveries=settings.max_deliveries)
        self.prompts.ensure()
        self.rollouts = Stream(r, self.keys.rollouts)
        self.weights = Stream(r, self.keys.weights)
        self.events = Stream(r, self.keys.events)
        self._weights_cursor = "0"
        self._held: list[tuple[Entry, pb.PromptGroup]] = []  # waiting for a newer version
        self._last_reclaim = 0.0
        self.stale_prompts = 0

    @classmethod
    def attach(cls, r: redis.Redis, run_id: str, settings: RolloutSettings) -> "RolloutWorker":
        spec = RunSpec.model_validate_json(r.get(keys.RunKeys(run_id).spec))
        engine = TorchEngine(spec.model, device=settings.device, max_batch_sequences=settings.max_batch_sequences)
        return cls(r, run_id, settings, engine)

    def status(self) -> dict:
        return {"version": self.engine.version, "held": len(self._held)}

    # -- the loop ----------------------------------------------------------------------------

    def poll(self) -> None:
        self.sync_weights(block_ms=0 if self.engine.version >= 0 else 500)
        if self.engine.version < 0:
            return  # nothing to generate with yet
        work = self._take_ready(self._held)
        if not work:
            entries = self._reclaim() or self.prompts.read(count=self._batch_groups(), block_ms=500)
            decoded = [(e, g) for e in entries if (g := self.prompts.decode(e, pb.PromptGroup)) is not None]
            work = self._take_ready(decoded)
        if work:
            self.generate(work)

    def _batch_groups(self) -> int:
        """How many groups to pull at once: enough to fill one decoding batch, at least one."""
        return max(1, self.settings.max_batch_sequences // 16)

    def _take_ready(self, items: list[tuple[Entry, pb.PromptGroup]]) -> list[tuple[Entry, pb.PromptGroup]]:
        """Split `items` into groups we can generate now; hold the ones needing newer weights."""
        ready, held = [], []
        for entry, group in items:
            if group.policy_version == self.engine.version:
                ready.append((entry, group))
            elif group.policy_version > self.engine.version:
                held.append((entry, group))
            else:
                self.stale_prompts += 1
                log.warning("prompt group %s wants version %d but we serve %d: stale, skipped", group.group_id, group.policy_version, self.engine.version)
                self.prompts.ack(entry.id)
        self._held = held
        return ready

    def _reclaim(self) -> list[Entry]:
        now = time.time()
        if now - self._last_reclaim < self.settings.heartbeat_ttl_seconds / 2:
            return []
        self._last_reclaim = now
        return self.prompts.reclaim(alive_workers(self.r, SERVICE))

    # -- weights -----------------------------------------------------------------------------

    def sync_weights(self, block_ms: int = 0) -> None:
        """Load the newest announced version if it is newer than ours, then acknowledge it."""
        updates = self.weights.read_after(self._weights_cursor, pb.WeightUpdate, block_ms=block_ms or None)
        if not updates:
            return
        self._weights_cursor = updates[-1][0]
        newest = max((u for _, u in updates), key=lambda u: u.version)
        if newest.version <= self.engine.version:
            return
        t0 = time.perf_counter()
        self.engine.load_weights(newest)
        seconds = time.perf_counter() - t0
        WEIGHT_LOAD_SECONDS.observe(seconds)
        self.r.hset(self.keys.weight_versions, self.name, newest.version)
        self.events.add(
            pb.Event(run_id=self.run_id, at=time.time(), source=self.name, weights_loaded=pb.WeightsLoaded(version=newest.version, load_seconds=seconds))
        )
        log.info("loaded weights v%d in %.2fs", newest.version, seconds)

    # -- generation --------------------------------------------------------------------------

    def generate(self, work: list[tuple[Entry, pb.PromptGroup]]) -> None:
        requests = []
        prompt_ids = []
        for _, g in work:
            ids = self.engine.render_prompt([{"role": m.role, "content": m.content} for m in g.messages])
            prompt_ids.append(ids)
            s = g.sampling
            requests.append(GenerationRequest(ids, s.n, s.temperature, s.top_p or 1.0, s.max_tokens, s.seed))
        try:
            results, stats = self.engine.generate(requests)
        except Exception:
            ERRORS.labels(service=SERVICE).inc()
            raise
        ROLLOUT_GENERATION_SECONDS.observe(stats.seconds)
        ROLLOUT_TOKENS.inc(stats.tokens)
        version = self.engine.version
        pipe = self.r.pipeline(transaction=True)  # publish + ack atomically (same hash slot)
        for (entry, group), ids, samples in zip(work, prompt_ids, results):
            out = pb.RolloutGroup(prompt=group, prompt_ids=ids, worker=self.name, generation_seconds=stats.seconds)
            for s in samples:
                out.samples.add(response_ids=s.token_ids, logprobs=s.logprobs, finish_reason=s.finish_reason, text=s.text, policy_version=version)
            pipe.xadd(self.rollouts.key, codec.encode(out))
        pipe.xack(self.prompts.stream, GROUP, *(entry.id for entry, _ in work))
        pipe.execute()
        log.debug("generated %d groups (%d tokens) in %.2fs", len(work), stats.tokens, stats.seconds)


def run(settings: RolloutSettings | None = None) -> int:
    from magic.common.service import serve

    settings = settings or RolloutSettings()
    return serve(SERVICE, settings, lambda r, run_id: RolloutWorker.attach(r, run_id, settings))

