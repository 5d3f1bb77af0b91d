"""The rollout worker: prompt groups in, sampled groups out, always at the prompt's policy version.

    attach: follow the `weights` stream from its newest announcement (older versions may be
            garbage-collected already)
    loop:
        follow the `weights` stream; hand new announcements to the weight receiver (it loads
          the newest version, or relays NCCL phases), record the version in `weight_versions`
          (the one channel the controller's version barrier reads; `magic.store.steps`)
        admit prompt groups while the engine has free slots — pulled from the shared queue by
          whichever worker has room (dynamic load balancing, no static split)
          - a group asking for a newer version waits for it (its entry stays pending)
          - a group asking for an older version is stale: never generated with other weights
          - with bounded staleness (the group's max_staleness s >= 1) any version of
            policy_version - s ... policy_version generates it; a newer version is loaded between
            groups: once the groups in flight that their window allows are finished
          - when idle, take over groups pending too long at another live worker (stragglers)
        advance the engine; publish each finished group to `rollouts` and acknowledge its prompt

Stragglers: a group still pending at a live worker after `straggler_seconds` is claimed by an
idle worker and generated again at the same policy version; whichever copy finishes first is
published (a finished copy whose prompt was already acknowledged is dropped, and the learner's
ledger drops any duplicate that slips through). Dead workers' groups are reclaimed as before.

Poison is contained to its entry: a prompt that does not decode, that the controller did not
publish (`StepStore.check_group`), or that the engine refuses (a bad sampling request, a prompt
the engine cannot render) is dead-lettered with the reason and the worker goes on; a garbage
entry on `weights` is recorded once in the dead-letter stream and skipped.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass

from magic.observability import metrics as m
from magic.protocol import codec, keys
from magic.protocol.pb import messages_pb2 as pb
from magic.rollout.engine import GeneratedSample, GenerationRequest, RolloutEngine, TorchEngine
from magic.rollout.settings import RolloutSettings
from magic.rollout.vllm_engine import VllmEngine
from magic.rollout.vllm_metrics import VllmMetrics
from magic.rollout.vllm_server import launch_server
from magic.runtime import faults
from magic.runtime.service import Worker, WorkerRestart, serve
from magic.store.channels import RunChannels
from magic.store.streams import Entry
from magic.weights import WeightIntegrityError, WeightReceiver, make_receiver

log = logging.getLogger(__name__)

SERVICE = "rollout"
GROUP = keys.ROLLOUT_GROUP
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
        server = launch_server(settings, model_path) if settings.vllm_launch else None
        url = server.url if server else settings.vllm_url
        try:
            return VllmEngine(url, model_path, settings.vllm_model, settings.max_batch_sequences, settings.vllm_request_timeout_seconds, server=server)
        except BaseException:
            if server is not None:
                server.stop()
            raise
    return TorchEngine(model_path, device=settings.device, max_batch_sequences=settings.max_batch_sequences)


def window(group: pb.PromptGroup) -> tuple[int, int]:
    """The policy versions that may generate `group`: policy_version - max_staleness ... policy_version."""
    return max(0, group.policy_version - group.max_staleness), group.policy_version


class RolloutWorker(Worker):
    def __init__(self, channels: RunChannels, settings: RolloutSettings, engine: RolloutEngine, receiver: WeightReceiver):
        self.channels = channels
        self.run_id = channels.run_id
        self.settings = settings
        self.engine = engine
        self.receiver = receiver
        self.name = settings.worker_name
        self.prompts = channels.group("prompts", GROUP)
        self.rollouts = channels.stream("rollouts")
        self.weights = channels.stream("weights")
        self.steps = channels.steps
        self.armed = settings.armed_faults
        self._newest_epoch = 0  # of the learner lease, among the announcements read
        self._newest_version = -1  # among the announcements read: an older one after it is a replay
        self._weights_cursor = self._newest_cursor()
        self._weight_failures = 0
        self._work: dict[str, _Work] = {}  # entry id -> group in the engine
        self._held: list[tuple[Entry, pb.PromptGroup]] = []  # waiting for a newer version
        self._deferred_load: int | None = None  # a newer version announced, loaded once the groups in flight are done
        self._pending: list[pb.WeightUpdate] = []  # announcements checked and not loaded yet
        self._stolen_ids: set[str] = set()  # claimed from a straggling worker, not yet submitted
        self._group_size = settings.max_batch_sequences  # gs of the last group seen (until then: pull one group)
        self._recent_tokens: collections.deque[tuple[float, int]] = collections.deque()
        self._endpoint = receiver.endpoint_status(engine)
        m.DEAD_LETTERS.labels(stream="weights")  # at 0 before a first poison announcement (see `ConsumerGroup`)
        self.stale_prompts = 0
        self.stolen = 0
        self._vllm_metrics: VllmMetrics | None = None  # set by `attach` (engine vllm)

    @classmethod
    def attach(cls, channels: RunChannels, settings: RolloutSettings, vllm_metrics: VllmMetrics | None = None) -> "RolloutWorker":
        engine = build_engine(settings, channels.spec().model)
        if vllm_metrics is not None and isinstance(engine, VllmEngine):  # a launched server's port is new at each attach
            vllm_metrics.url = engine.base_url
        cache = settings.data_dir / "weights-cache" / settings.worker_name
        worker = cls(channels, settings, engine, make_receiver(settings.weight_transport, worker_name=settings.worker_name, cache_dir=cache))
        worker._vllm_metrics = vllm_metrics
        return worker

    def status(self) -> dict:
        return {"version": self.engine.version, "held": len(self._held), "in_flight": len(self._work), **self._endpoint}

    def problem(self) -> str | None:
        """Why this worker cannot serve: its engine's server is gone (the engine says)."""
        check = getattr(self.engine, "problem", None)
        return check() if check else None

    def close(self) -> None:
        self.engine.abort()
        self.engine.close()
        self.receiver.close()
        if self._vllm_metrics is not None and self.settings.vllm_launch:  # its server stops with the engine: no series, no "down"
            self._vllm_metrics.url = None

    # -- the loop ----------------------------------------------------------------------------

    def poll(self) -> None:
        self.sync_weights(block_ms=0 if self.engine.version >= 0 else 500)
        if self.engine.version < 0:
            return  # nothing to generate with yet
        if self._deferred_load is None:  # else: the groups in flight finish before the new weights load
            self.admit()
        if self._work:
            self.collect(self.engine.step())
        m.ROLLOUT_IN_FLIGHT.set(self.settings.max_batch_sequences - self.engine.free_slots())

    def admit(self) -> None:
        """Fill the engine's free slots with ready groups: held ones first, then new ones, then stragglers."""
        ready = self._take_ready(self._held)
        if self._has_room(len(ready)):
            entries = self.prompts.reclaim_if_due(SERVICE, self.settings.heartbeat_ttl_seconds / 2, self.settings.heartbeat_ttl_seconds) or self._read(block=not self._work and not ready)
            decoded = [(e, g) for e in entries if (g := self.prompts.decode(e, pb.PromptGroup, check=self.steps.check_group)) is not None]
            ready += self._take_ready(decoded, keep_held=True)
        if not ready and not self._work:
            ready = self._take_ready(self._steal(), keep_held=True)
            for entry, _ in ready:
                self._stolen_ids.add(entry.id)
        for entry, group in ready:
            try:
                self._submit(entry, group)
            except WorkerRestart:
                raise  # the server, not the group: the worker attaches again (its entries stay pending)
            except Exception as exc:  # noqa: BLE001 — the engine refused this one group: contain it
                m.ERRORS.labels(service=SERVICE).inc()
                self.prompts.dead_letter(entry, f"the engine refused group {group.group_id}: {type(exc).__name__}: {exc}")

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
            lo, hi = window(group)
            if lo <= self.engine.version <= hi:
                ready.append((entry, group))
            elif self.engine.version < lo:
                held.append((entry, group))
            else:
                self._drop_stale(entry, group)
        self._held = (self._held + held) if keep_held else held
        return ready

    def _drop_stale(self, entry: Entry, group: pb.PromptGroup) -> None:
        self.stale_prompts += 1
        m.ROLLOUT_STALE_GROUPS.inc()
        lo, hi = window(group)
        wants = f"version {hi}" if lo == hi else f"versions {lo}-{hi}"
        log.warning("prompt group %s wants %s but we serve %d: stale, skipped", group.group_id, wants, self.engine.version)
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

    def _steal(self) -> list[tuple[Entry, pb.PromptGroup]]:
        """Claim groups of our version pending longer than `straggler_seconds` at other live workers."""
        count = max(1, self.engine.free_slots() // max(1, self._group_size))
        out = []
        for entry in self.prompts.claim_idle(int(self.settings.straggler_seconds * 1000), count):
            group = self.prompts.decode(entry, pb.PromptGroup, check=self.steps.check_group) if entry.fields else None
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
        for work, _ in done:
            faults.point(self.armed, "rollout.generated", work.group.step)
        still_pending = self.prompts.still_pending([w.entry.id for w, _ in done])
        now = time.time()
        outputs = []
        for work, samples in done:
            if work.entry.id not in still_pending:
                log.info("group %s was finished elsewhere first; dropping our copy", work.group.group_id)
                continue
            seconds = now - work.admitted_at
            out = pb.RolloutGroup(prompt=work.group, prompt_ids=work.prompt_ids, worker=self.name, generation_seconds=seconds)
            for s in samples:
                out.samples.add(response_ids=s.token_ids, logprobs=s.logprobs, finish_reason=s.finish_reason, text=s.text, policy_version=self.engine.version)
            outputs.append(out)
            m.ROLLOUT_GENERATION_SECONDS.observe(seconds)
            tokens = sum(len(s.token_ids) for s in samples)
            m.ROLLOUT_TOKENS.inc(tokens)
            self._recent_tokens.append((now, tokens))
        self.prompts.publish_and_ack(self.rollouts, outputs, [w.entry.id for w, _ in done])
        for work, _ in done:
            faults.point(self.armed, "rollout.published", work.group.step)
        self._update_rate(now)
        log.debug("published %d groups", len(outputs))

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
        """Hand new announcements to the receiver; record and announce the version it loads. Each
        announcement is checked once, as it is read, and kept (`_pending`) until it is loaded:
        while groups of a later step are in flight (bounded staleness: they finish with the
        weights they started with) or while a load is retried."""
        updates = self.weights.read_after(self._weights_cursor, pb.WeightUpdate, block_ms=block_ms or None, poison=self._poisoned_weights)
        for entry_id, u in updates:  # authenticated: this run's learner, a lease epoch that exists and is current
            problem = self.steps.announcement_problem(u, self._newest_epoch)
            newest = max(self.engine.version, self._newest_version)
            if problem is None and u.version < newest:
                problem = f"v{u.version} is older than v{newest}, announced before it (a replay)"
            if problem is not None:
                self._poisoned_weights(Entry(entry_id, codec.encode(u)), f"refused WeightUpdate: {problem}")
                continue
            self._newest_epoch = max(self._newest_epoch, u.epoch)
            self._newest_version = max(self._newest_version, u.version)
            self._pending.append(u)
        if updates:
            self._weights_cursor = updates[-1][0]
        if not self._pending:
            return
        before, t0 = self.engine.version, time.perf_counter()
        batch = list(self._pending)
        newest = max(u.version for u in batch)
        if self._work and newest > before:
            self._abort_superseded(newest)
            if self._work:  # bounded staleness: groups their window allows finish with the weights they started with
                if self._deferred_load != newest:
                    log.info("v%d announced: loaded once the %d groups in flight at v%d are done", newest, len(self._work), before)
                self._deferred_load = newest
                return
        self._deferred_load = None
        try:
            self.receiver.receive_batch(batch, self.engine)
        except WeightIntegrityError as exc:
            m.ERRORS.labels(service=SERVICE).inc()
            self._weight_failures += 1
            if self._weight_failures < WEIGHT_RETRIES:
                log.warning("weights not loadable yet (attempt %d): %s", self._weight_failures, exc)
                time.sleep(1.0)
                return  # kept: the same announcements are retried
            # the announced bytes are gone or damaged (a half-written or cut file on the volume):
            # no worker can serve that version, so the run fails now, saying so, rather than stall
            raise WeightIntegrityError(f"the announced weights cannot be loaded after {self._weight_failures} attempts: {exc}") from None
        self._pending = []
        self._weight_failures = 0
        if self.engine.version != before:
            self._loaded(self.engine.version, time.perf_counter() - t0, batch[-1].transport)

    def _newest_cursor(self) -> str:
        """The cursor that makes the first read start at the newest announcement of this run: a
        worker (re)started late skips the versions before it (garbage-collected already)."""
        newest = self.weights.newest(pb.WeightUpdate, check=self.steps.announcement_problem, rank=lambda u: (u.version, u.epoch))
        if newest is None:
            return "0"
        ms, seq = (int(x) for x in newest[0].split("-"))
        return f"{ms}-{seq - 1}" if seq > 0 else f"{ms - 1}-{2**64 - 1}"

    def _poisoned_weights(self, entry: Entry, reason: str) -> None:
        """A garbage entry on the fan-out stream: every follower skips it; it is recorded once."""
        m.ERRORS.labels(service=SERVICE).inc()
        self.channels.dead_letter_once(self.weights, entry, reason)

    def _abort_superseded(self, newest: int) -> None:
        """Version `newest` is announced only once step newest - 1 is complete, so groups still in
        flight of a step before `newest` are copies finished elsewhere: drop them. Groups of later
        steps (published ahead with bounded staleness) stay: they may use the weights in use."""
        done = [key for key, work in self._work.items() if work.group.policy_version < newest]
        for key in self.engine.abort(done) if done else []:
            work = self._work.pop(key)
            self._drop_stale(work.entry, work.group)

    def _loaded(self, version: int, seconds: float, transport: str) -> None:
        m.WEIGHT_LOAD_SECONDS.observe(seconds)
        m.ROLLOUT_WEIGHT_VERSION.set(version)
        faults.point(self.armed, "rollout.loaded", version - 1)
        self.steps.serve_version(self.name, version)
        log.info("serving weights v%d (%s, %.2fs)", version, transport, seconds)


def run(settings: RolloutSettings | None = None) -> int:
    settings = settings or RolloutSettings()
    vllm_metrics = None
    if settings.engine == "vllm":  # vLLM's /metrics on the worker's metrics port (vLLM itself listens on localhost)
        vllm_metrics = VllmMetrics(None if settings.vllm_launch else settings.vllm_url)
        m.registry_of(SERVICE).register(vllm_metrics)
    return serve(SERVICE, settings, lambda channels: RolloutWorker.attach(channels, settings, vllm_metrics))
