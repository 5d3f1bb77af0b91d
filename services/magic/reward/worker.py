"""The reward service: rollout groups in, one score per sample out; and scoring on demand over HTTP.

    loop:
        pull up to `read_groups` rollout groups (reclaiming those of dead reward workers)
        score all their samples concurrently — math in timeboxed processes, code by the code judge
        publish each scored group, then acknowledge its rollout entry (atomically)

A sample that cannot be judged gets verdict ERROR and reward 0 and never fails its group; an
entry that does not decode, or whose prompt is not one the controller published
(`magic.store.steps`), is dead-lettered with the reason. The process also serves, on ``MAGIC_METRICS_PORT``,
GET /metrics, /livez, /readyz (ready once the verifiers passed their self-check) and, on its own
port ``MAGIC_SCORE_PORT``, POST /v1/score (`magic.reward.api`), whether or not a run is active.

Departures from Skywork-OR1: the math verifier is MAGIC's stricter one by default
(``MAGIC_MATH__VERIFIER=skywork-or1`` selects the paper's plain procedure); code runs in the code
judge's sandbox (`magic.codejudge`) with a fresh process per test instead of LiveCodeBench's
in-process harness.

    magic serve reward          # or: python -m magic.reward
"""

from __future__ import annotations

import logging
import threading

from pydantic import ValidationError

from magic.config.schema import PenaltySettings
from magic.observability.logs import setup_logging
from magic.observability.metrics import registry_of, serve_http
from magic.runtime.liveness import LoopWatch
from magic.protocol import codec, keys
from magic.protocol.pb import messages_pb2 as pb
from magic.reward.api import ScoreAPI, serve_score
from magic.reward.scoring import Sample, Scorer
from magic.reward.settings import RewardSettings
from magic.runtime import faults
from magic.runtime.service import Worker, serve
from magic.store.channels import RunChannels
from magic.store.streams import Entry

log = logging.getLogger(__name__)

SERVICE = "reward"
GROUP = keys.REWARD_GROUP


def samples_of(group: pb.RolloutGroup) -> list[Sample]:
    """The scoring inputs of a rollout group's samples, with its stage's penalties if it carries
    some; raises ValueError when they are malformed."""
    p = group.prompt
    problem = next((m.content for m in reversed(p.messages) if m.role == "user"), "")
    penalties = None
    if p.penalties_json:
        try:
            penalties = PenaltySettings.model_validate_json(p.penalties_json)
        except ValidationError as exc:
            raise ValueError(f"group {p.group_id}: malformed penalties_json: {exc.errors()[:1]}") from None
    return [
        Sample(
            data_source=p.data_source,
            response=s.text,
            ground_truth=p.ground_truth,
            problem=problem,
            response_tokens=len(s.response_ids) or None,
            max_tokens=p.sampling.max_tokens or None,
            penalties=penalties,
        )
        for s in group.samples
    ]


class RewardWorker(Worker):
    def __init__(self, channels: RunChannels, settings: RewardSettings, scorer: Scorer, watch: LoopWatch | None = None):
        self.settings = settings
        self.scorer = scorer
        self.watch = watch
        self.name = settings.worker_name
        self.rollouts = channels.group("rollouts", GROUP)
        self.scored = channels.stream("scored")
        self.estimates = channels.stream("estimates")
        self.steps = channels.steps
        self.armed = settings.armed_faults
        self.groups_scored = 0

    def status(self) -> dict:
        return {"groups_scored": self.groups_scored}

    def poll(self) -> None:
        entries = self.rollouts.reclaim_if_due(SERVICE, self.settings.heartbeat_ttl_seconds / 2, self.settings.heartbeat_ttl_seconds) or self.rollouts.read(count=self.settings.read_groups, block_ms=500)
        batch = [(e, g) for e in entries if (g := self.rollouts.decode(e, pb.RolloutGroup, check=self._problem)) is not None]
        if batch:
            self.score(batch)

    def _problem(self, group: pb.RolloutGroup) -> str | None:
        """Why `group` is not scored, or None: its prompt must be one the controller published,
        with the gs samples it asked for."""
        if (problem := self.steps.check_group(group.prompt)) is not None:
            return problem
        if len(group.samples) != group.prompt.sampling.n:
            return f"group {group.prompt.group_id}: {len(group.samples)} samples, the prompt asked for {group.prompt.sampling.n}"
        return None

    def score(self, batch: list[tuple[Entry, pb.RolloutGroup]]) -> None:
        """Score every sample of the groups together, then publish and acknowledge group by group.
        A group whose scoring inputs are malformed goes to the dead-letter stream."""
        valid, per_group = [], []
        for entry, group in batch:
            try:
                per_group.append(samples_of(group))
                valid.append((entry, group))
            except ValueError as exc:
                self.rollouts.dead_letter(entry, str(exc))
        batch = valid
        samples = [s for samples in per_group for s in samples]
        if self.watch is not None and any(self.scorer.kind(s.data_source) == "code" for s in samples):
            # code answers wait for a code judge that cannot take them yet (reward.code): a wait, not a hang
            judge = self.settings.code_judge
            with self.watch.allowing(judge.wait_seconds + judge.timeout_seconds + 60, "code answers waiting for the code judge"):
                scores = iter(self.scorer.score_many(samples))
        else:
            scores = iter(self.scorer.score_many(samples))
        for (entry, group), samples in zip(batch, per_group):
            out = pb.ScoredGroup(worker=self.name)
            out.scores.extend(next(scores) for _ in samples)
            faults.point(self.armed, "reward.scored", group.prompt.step)
            # difficulty-estimation and validation groups go to the controller, never to the learner
            target = self.scored if group.prompt.kind == pb.GROUP_KIND_TRAIN else self.estimates
            # the rollout as it was read (decoded and checked above), not copied and re-encoded
            scored = codec.encode_around(out, "rollout", entry.fields[codec.PAYLOAD_FIELD])
            self.rollouts.publish_and_ack(target, [scored], [entry.id])
            faults.point(self.armed, "reward.published", group.prompt.step)
            self.groups_scored += 1


def _warm_up(scorer: Scorer) -> None:
    try:
        scorer.warm_up()
    except Exception:  # noqa: BLE001 — stays not ready; the log says why
        log.exception("the math verifier failed its self-check; the service stays not ready")
        return
    if scorer.code.configured:
        log.info("verifiers ready; code answers go to the code judge at %s", scorer.settings.code_judge.url)
    else:
        log.warning("no code judge (MAGIC_CODE_JUDGE__URL is empty): code samples will be judged ERROR")


def run(settings: RewardSettings | None = None) -> int:
    settings = settings or RewardSettings()
    setup_logging(SERVICE, settings.worker_name, settings.log_level)
    scorer = Scorer(settings)
    threading.Thread(target=_warm_up, args=(scorer,), name="reward-warm-up", daemon=True).start()
    watch = LoopWatch(settings.liveness_stall_seconds)
    if settings.metrics_port is not None:  # probes and metrics: ready once the verifiers passed their self-check
        serve_http(settings.metrics_port, scorer.ready, registry=registry_of(SERVICE), stalled=watch.stalled)
    if settings.score_port is not None:  # POST /v1/score runs submitted code: a port of its own
        if settings.api_token is None:
            log.warning("MAGIC_API_TOKEN is not set: POST /v1/score refuses every request")
        serve_score(settings.score_port, ScoreAPI(scorer, settings.max_request_samples, settings.api_token).handle)
    try:
        runtime = settings.model_copy(update={"metrics_port": None})  # the endpoint is already up
        return serve(SERVICE, runtime, lambda channels: RewardWorker(channels, settings, scorer, watch), watch)
    finally:
        scorer.close()
