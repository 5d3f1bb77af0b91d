"""The rollout worker: prompt groups in, sampled groups out, always at the prompt's policy version.

    loop:
        follow the `weights` stream; hand new announcements to the weight receiver (it loads
          the newest version, or relays NCCL phases), record the version, announce WeightsLoaded
        admit prompt groups while the engine has free slots — pulled from the shared queue by
          whichever worker has room (dynamic load balancing, no static split)
          - a group asking for a newer version waits for it (its entry stays pending)
          - a group asking for an older version is stale: never generated with other weights
          - when idle, take over groups pending too long at another live worker (stragglers)
        advance the engine; publish each finished group to `rollouts` and acknowledge its prompt

Stragglers: a group still pending at a live worker after `straggler_seconds` is claimed by an
idle worker and generated again at the same policy version; whichever copy finishes first is
published (a finished copy whose prompt was already acknowledged is dropped, and the learner's
ledger drops any duplicate that slips through). Dead workers' groups are reclaimed as before.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass

import redis

from magic.common import codec, keys, metrics as m
from magic.common.bus import ConsumerGroup, Entry, Stream
from magic.common.config import RolloutSettings, RunSpec
from magic.common.heartbeat import alive_workers
from magic.common.pb import messages_pb2 as pb
from magic.common.service import Worker
from magic.common.weights import WeightIntegrityError, WeightReceiver, make_receiver
from magic.rollout.engine import GeneratedSample, GenerationRequest, RolloutEngine

log = logging.getLogger(__name__)

SERVICE = "rollout"
GROUP = "rollout"
MAX_ENGINE_ATTEMPTS = 3
WEIGHT_RETRIES = 3


@dataclass
class _Work:
    entry: Entry
    group: pb.PromptGroup
    prompt_ids: list[int]
    admitted_at: float
    stolen: bool = False
    attempts: int = 1


def build_engine(settings: RolloutSettings, model_path: str) -> RolloutEngine:
    """The engine named by `settings.engine`."""
    if settings.engine == "vllm":
        from magic.rollout.vllm_engine import VllmEngine

        return VllmEngine(settings.vllm_url, model_path, settings.vllm_model, settings.max_batch_sequences, settings.vllm_request_timeout_seconds)
    from magic.rollout.engine import TorchEngine

    return TorchEngine(model_path, device=settings.device, max_batch_sequences=settings.max_batch_sequences)


class RolloutWorker(Worker):
    def __init__(self, r: redis.Redis, run_id: str, settings: RolloutSettings, engine: RolloutEngine, receiver: WeightReceiver):
        self.r = r
        self.run_id = run_id
        self.settings = settings
        self.engine = engine
        self.receiver = receiver
        self.keys = keys.RunKeys(run_id)
        self.name = settings.worker_name
        self.prompts = ConsumerGroup(r, self.keys.prompts, GROUP, self.name, dead_stream=self.keys.dead, max_deliveries=settings.max_deliveries)
        self.prompts.ensure()
        self.rollouts = Stream(r, self.keys.rollouts)
        self.weights = Stream(r, self.keys.weights)
        self.events = Stream(r, self.keys.events)
        self._weights_cursor = "0"
        self._weight_failures = 0
        self._work: dict[str, _Work] = {}  # entry id -> group in the engine
        self._held: list[tuple[Entry, pb.PromptGroup]] = []  # waiting for a newer version
        self._stolen_ids: set[str] = set()  # claimed from a straggling worker, not yet submitted
        self._last_reclaim = 0.0
        self._group_size = settings.max_batch_sequences  # gs of the last group seen (until then: pull one group)
        self._recent_tokens: collections.deque[tuple[float, int]] = collections.deque()
        self._endpoint = receiver.endpoint_status(engine)
        self.stale_prompts = 0
        self.stolen = 0

    @classmethod
    def attach(cls, r: redis.Redis, run_id: str, settings: RolloutSettings) -> "RolloutWorker":
        spec = RunSpec.model_validate_json(r.get(keys.RunKeys(run_id).spec))
        engine = build_engine(settings, spec.model)
        cache = settings.data_dir / "weights-cache" / settings.worker_name
        return cls(r, run_id, settings, engine, make_receiver(settings.weight_transport, worker_name=settings.worker_name, cache_dir=cache))

    def status(self) -> dict:
        return {"version": self.engine.version, "held": len(self._held), "in_flight": len(self._work), **self._endpoint}

    def close(self) -> None:
        self.engine.abort()
        self.engine.close()
        self.receiver.close()

    # -- the loop ----------------------------------------------------------------------------

    def poll(self) -> None:
        self.sync_weights(block_ms=0 if self.engine.version >= 0 else 500)
        if self.engine.version < 0:
            return  # nothing to generate with yet
        self.admit()
        if self._work:
            self.collect(self.engine.step())
        m.ROLLOUT_IN_FLIGHT.set(self.settings.max_batch_sequences - self.engine.free_slots())

    def admit(self) -> None:
        """Fill the engine's free slots with ready groups: held ones first, then new ones, then stragglers."""
        ready = self._take_ready(self._held)
        if self._has_room(len(ready)):
            entries = self._reclaim() or self._read(block=not self._work and not ready)
            decoded = [(e, g) for e in entries if (g := self.prompts.decode(e, pb.PromptGroup)) is not None]
            ready += self._take_ready(decoded, keep_held=True)
        if not ready and not self._work:
            ready = self._take_ready(self._steal(), keep_held=True)
            for entry, _ in ready:
                self._stolen_ids.add(entry.id)
        for entry, group in ready:
            self._submit(entry, group)

    def _has_room(self, queued: int) -> bool:
        return self.engine.free_slots() - queued * self._group_size >= self._group_size or (not self._work and not queued)

    def _read(self, block: bool) -> list[Entry]:
        count = max(1, (self.engine.free_slots() // max(1, self._group_size)))
        return self.prompts.read(count=count, block_ms=200 if block else None)

    def _take_ready(self, items: list[tuple[Entry, pb.PromptGroup]], keep_held: bool = False) -> list[tuple[Entry, pb.PromptGroup]]:
        """Split `items` into groups we can generate now; hold the ones needing newer weights."""
        ready, held = [], []
        for entry, group in items:
            if entry.id in self._work:
                continue  # already generating it (e.g. re-read after a reclaim)
            if group.policy_version == self.engine.version:
                ready.append((entry, group))
            elif group.policy_version > self.engine.version:
                held.append((entry, group))
            else:
                self._drop_stale(entry, group)
        self._held = (self._held + held) if keep_held else held
        return ready

    def _drop_stale(self, entry: Entry, group: pb.PromptGroup) -> None:
        self.stale_prompts += 1
        m.ROLLOUT_STALE_GROUPS.inc()
        log.warning("prompt group %s wants version %d but we serve %d: stale, skipped", group.group_id, group.policy_version, self.engine.version)
        self.prompts.ack(entry.id)

    def _submit(self, entry: Entry, group: pb.PromptGroup, attempts: int = 1) -> None:
        ids = self.engine.render_prompt([{"role": msg.role, "content": msg.content} for msg in group.messages])
        s = group.sampling
        self._group_size = max(1, s.n)
        self.engine.submit(entry.id, GenerationRequest(ids, s.n, s.temperature, s.top_p or 1.0, s.max_tokens, s.seed))
        now = time.time()
        self._work[entry.id] = _Work(entry, group, ids, now, stolen=entry.id in self._stolen_ids, attempts=attempts)
        self._stolen_ids.discard(entry.id)
        if group.published_at:
            m.ROLLOUT_QUEUE_WAIT_SECONDS.observe(max(0.0, now - group.published_at))

    def _reclaim(self) -> list[Entry]:
        """Entries left pending by dead workers (checked every half heartbeat TTL)."""
        now = time.time()
        if now - self._last_reclaim < self.settings.heartbeat_ttl_seconds / 2:
            return []
        self._last_reclaim = now
        return self.prompts.reclaim(alive_workers(self.r, SERVICE))

    def _steal(self) -> list[tuple[Entry, pb.PromptGroup]]:
        """Claim groups of our version pending longer than `straggler_seconds` at other live workers."""
        idle_ms = int(self.settings.straggler_seconds * 1000)
        count = max(1, self.engine.free_slots() // max(1, self._group_size))
        rows = self.r.xpending_range(self.prompts.stream, GROUP, "-", "+", count * 4, idle=idle_ms)
        ids = [row["message_id"] for row in rows if row["consumer"].decode() != self.name][:count]
        if not ids:
            return []
        claimed = self.r.xclaim(self.prompts.stream, GROUP, self.name, idle_ms, ids)
        out = []
        for raw_id, fields in claimed:
            entry = Entry(raw_id.decode() if isinstance(raw_id, bytes) else raw_id, fields or {})
            group = self.prompts.decode(entry, pb.PromptGroup) if entry.fields else None
            if group is not None:
                out.append((entry, group))
        if out:
            self.stolen += len(out)
            m.ROLLOUT_STOLEN_GROUPS.inc(len(out))
            log.info("took over %d straggling groups: %s", len(out), [g.group_id for _, g in out])
        return out

    # -- results -----------------------------------------------------------------------------

    def collect(self, finished: list[tuple[str, list[GeneratedSample] | Exception]]) -> None:
        """Publish finished groups (with their prompt's ack, atomically); retry or dead-letter failures."""
        done = []
        for key, result in finished:
            work = self._work.pop(key, None)
            if work is None:
                continue
            if isinstance(result, Exception):
                self._failed(work, result)
            else:
                done.append((work, result))
        if not done:
            return
        still_pending = self._still_pending([w.entry.id for w, _ in done])
        now = time.time()
        pipe = self.r.pipeline(transaction=True)  # publish + ack atomically (same hash slot)
        published = 0
        for work, samples in done:
            if work.entry.id not in still_pending:
                log.info("group %s was finished elsewhere first; dropping our copy", work.group.group_id)
                continue
            seconds = now - work.admitted_at
            out = pb.RolloutGroup(prompt=work.group, prompt_ids=work.prompt_ids, worker=self.name, generation_seconds=seconds)
            for s in samples:
                out.samples.add(response_ids=s.token_ids, logprobs=s.logprobs, finish_reason=s.finish_reason, text=s.text, policy_version=self.engine.version)
            pipe.xadd(self.rollouts.key, codec.encode(out))
            m.ROLLOUT_GENERATION_SECONDS.observe(seconds)
            tokens = sum(len(s.token_ids) for s in samples)
            m.ROLLOUT_TOKENS.inc(tokens)
            self._recent_tokens.append((now, tokens))
            published += 1
        pipe.xack(self.prompts.stream, GROUP, *(w.entry.id for w, _ in done))
        pipe.execute()
        self._update_rate(now)
        log.debug("published %d groups", published)

    def _still_pending(self, entry_ids: list[str]) -> set[str]:
        """The entries not yet acknowledged by anyone (a copy finished elsewhere was acknowledged there)."""
        pipe = self.r.pipeline(transaction=False)
        for entry_id in entry_ids:
            pipe.xpending_range(self.prompts.stream, GROUP, entry_id, entry_id, 1)
        return {entry_id for entry_id, rows in zip(entry_ids, pipe.execute()) if rows}

    def _failed(self, work: _Work, exc: Exception) -> None:
        m.ERRORS.labels(service=SERVICE).inc()
        if work.attempts >= MAX_ENGINE_ATTEMPTS:
            self.prompts.dead_letter(work.entry, f"the engine failed this group {work.attempts} times: {exc}")
            return
        log.warning("group %s failed (%s); retrying", work.group.group_id, exc)
        self._submit(work.entry, work.group, attempts=work.attempts + 1)

    def _update_rate(self, now: float) -> None:
        while self._recent_tokens and now - self._recent_tokens[0][0] > 10:
            self._recent_tokens.popleft()
        m.ROLLOUT_TOKENS_PER_SECOND.set(sum(t for _, t in self._recent_tokens) / 10.0)

    # -- weights -----------------------------------------------------------------------------

    def sync_weights(self, block_ms: int = 0) -> None:
        """Hand new announcements to the receiver; record and announce the version it loads."""
        updates = self.weights.read_after(self._weights_cursor, pb.WeightUpdate, block_ms=block_ms or None)
        if not updates:
            return
        before, t0 = self.engine.version, time.perf_counter()
        batch = [u for _, u in updates]
        if self._work and any(u.version > before for u in batch):
            self._abort_superseded()
        try:
            self.receiver.receive_batch(batch, self.engine)
        except WeightIntegrityError as exc:
            m.ERRORS.labels(service=SERVICE).inc()
            self._weight_failures += 1
            if self._weight_failures < WEIGHT_RETRIES:
                log.warning("weights not loadable yet (attempt %d): %s", self._weight_failures, exc)
                time.sleep(1.0)
                return  # the cursor stays: the same announcements are retried
            log.error("giving up on these weights after %d attempts: %s", self._weight_failures, exc)
        self._weight_failures = 0
        self._weights_cursor = updates[-1][0]
        if self.engine.version != before:
            self._loaded(self.engine.version, time.perf_counter() - t0, batch[-1].transport)

    def _abort_superseded(self) -> None:
        """A newer version is announced only once the current step is complete, so groups still in
        flight at the old version are copies finished elsewhere: drop them."""
        for key in self.engine.abort(list(self._work)):
            work = self._work.pop(key)
            self._drop_stale(work.entry, work.group)

    def _loaded(self, version: int, seconds: float, transport: str) -> None:
        m.WEIGHT_LOAD_SECONDS.observe(seconds)
        m.ROLLOUT_WEIGHT_VERSION.set(version)
        self.r.hset(self.keys.weight_versions, self.name, version)
        self.events.add(
            pb.Event(
                run_id=self.run_id,
                at=time.time(),
                source=self.name,
                weights_loaded=pb.WeightsLoaded(version=version, load_seconds=seconds, transport=transport),
            )
        )
        log.info("serving weights v%d (%s, %.2fs)", version, transport, seconds)


def run(settings: RolloutSettings | None = None) -> int:
    from magic.common.service import serve

    settings = settings or RolloutSettings()
    return serve(SERVICE, settings, lambda r, run_id: RolloutWorker.attach(r, run_id, settings))
