"""Metric names (the Grafana dashboards depend on them) and the /metrics, /livez, /readyz endpoint.

Per-step training figures are computed once by the learner as a flat record
(`{"entropy": ..., "accuracy_all": ...}`), sent to the controller in `StepCompleted`, written to
the run's JSONL log, and exported here as gauges. `STEP_GAUGES` maps record keys to Prometheus
series; keys without a gauge still reach the JSONL log.

Every series carries the prefix `magic_` and follows Prometheus naming conventions. A process
exports only the series its service owns (`OWNERS`, `registry_of`), and a gauge has no sample
until it is first set: no process reports a figure it does not compute, and no figure reads 0
before it is known (a restarted learner leaves a gap, not a drop to 0).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import lru_cache
from http.server import ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics import MetricWrapperBase

from magic.runtime import httpserver

log = logging.getLogger(__name__)


class FigureGauge(Gauge):
    """A Gauge with no sample until it is first set, increased or decreased: an unknown figure is
    absent from /metrics rather than a fake 0."""

    def _metric_init(self) -> None:
        super()._metric_init()
        self._observed = False

    def set(self, value: float) -> None:
        super().set(value)
        self._observed = True

    def inc(self, amount: float = 1) -> None:
        super().inc(amount)
        self._observed = True

    def dec(self, amount: float = 1) -> None:
        super().dec(amount)
        self._observed = True

    def _child_samples(self):
        return super()._child_samples() if self._observed else ()


# -- training figures (owner: learner) --------------------------------------------------------
POLICY_ENTROPY = FigureGauge("magic_policy_entropy", "Mean per-token entropy of the policy over the rollout batch (nats)")
RESPONSE_CLIP_RATIO = FigureGauge("magic_response_clip_ratio", "Fraction of responses truncated at the context length T")
PG_CLIPFRAC = FigureGauge("magic_pg_clipfrac", "Fraction of response tokens whose ratio was clipped", ["side"])
REWARD_MEAN = FigureGauge("magic_reward_mean", "Mean reward of the rollout batch")
ACCURACY = FigureGauge("magic_accuracy", "Fraction of correct responses in the rollout batch", ["subset"])
RESPONSE_LENGTH = FigureGauge("magic_response_length_tokens", "Mean response length of the rollout batch (tokens)")
KL = FigureGauge(
    "magic_kl",
    "Per-token k3 KL estimates: kind=old (pi_old vs the policy being updated, over the SGD steps), kind=ref (to the reference policy), "
    "kind=rollout (the sampler's log-probs vs the learner's for the same policy version)",
    ["kind"],
)
ENTROPY_TARGET = FigureGauge("magic_entropy_target", "Target entropy tgt_ent of adaptive entropy control (nats/token)")
ENTROPY_COEF = FigureGauge("magic_entropy_coef", "Adaptive entropy coefficient c_k")
ENTROPY_BONUS_ACTIVE = FigureGauge("magic_entropy_bonus_active", "1 if the entropy bonus was applied this step (e_k <= tgt_ent), else 0")
ENTROPY_ALPHA = FigureGauge("magic_entropy_alpha", "Entropy-bonus weight alpha_k = c_k * 1{e_k <= tgt_ent} applied this step")
ADVANTAGE = FigureGauge("magic_advantage", "Advantages of the trained samples: stat=mean|std|abs_max", ["stat"])
SGD_STEPS = FigureGauge("magic_sgd_steps", "Optimizer steps of the last on-policy step (N_SGD = D_R / D_T * N_reuse)")
ZERO_ADV_GROUP_RATIO = FigureGauge("magic_zero_adv_group_ratio", "Fraction of groups whose advantages are all zero (rejected)")
ROLLOUT_IS = FigureGauge(
    "magic_rollout_is",
    "Importance weights w = pi_learner / pi_sampler of the sampled tokens (stage rollout_is): stat=clipfrac (share beyond the cap C), "
    "stat=weight_mean (mean weight applied; 1 with rollout_is none)",
    ["stat"],
)
GRAD_NORM = FigureGauge("magic_grad_norm", "Global gradient L2 norm before clipping")
PG_LOSS = FigureGauge("magic_pg_loss", "Policy-gradient loss of the last step")
VERSION_MISMATCH = Counter("magic_version_mismatch", "Samples dropped because their policy version is outside the step's window (k - max_staleness ... k)")
VERSION_LAG = FigureGauge(
    "magic_samples_by_version_lag",
    "Samples of the last step's rollout batch by policy-version lag k - v: lag=0 (on-policy), lag=stale (1 ... max_staleness: trained "
    "with the decoupled objective), lag=beyond (older: never trained)",
    ["lag"],
)
LEARNER_STEP = FigureGauge("magic_learner_step", "Last step the learner trained")

STEP_GAUGES: dict[str, tuple[Gauge, dict[str, str]]] = {
    "entropy": (POLICY_ENTROPY, {}),
    "response_clip_ratio": (RESPONSE_CLIP_RATIO, {}),
    "pg_clipfrac_high": (PG_CLIPFRAC, {"side": "high"}),
    "pg_clipfrac_low": (PG_CLIPFRAC, {"side": "low"}),
    "reward_mean": (REWARD_MEAN, {}),
    "accuracy_all": (ACCURACY, {"subset": "all"}),
    "accuracy_nontruncated": (ACCURACY, {"subset": "nontruncated"}),
    "response_length_mean": (RESPONSE_LENGTH, {}),
    "kl_old": (KL, {"kind": "old"}),
    "ppo_kl": (KL, {"kind": "ppo"}),
    "kl_ref": (KL, {"kind": "ref"}),
    "kl_rollout": (KL, {"kind": "rollout"}),
    "rollout_is_clipfrac": (ROLLOUT_IS, {"stat": "clipfrac"}),
    "rollout_is_weight": (ROLLOUT_IS, {"stat": "weight_mean"}),
    "entropy_alpha": (ENTROPY_ALPHA, {}),
    "advantage_mean": (ADVANTAGE, {"stat": "mean"}),
    "advantage_std": (ADVANTAGE, {"stat": "std"}),
    "advantage_abs_max": (ADVANTAGE, {"stat": "abs_max"}),
    "sgd_steps": (SGD_STEPS, {}),
    "entropy_target": (ENTROPY_TARGET, {}),
    "entropy_coef": (ENTROPY_COEF, {}),
    "entropy_bonus_active": (ENTROPY_BONUS_ACTIVE, {}),
    "zero_adv_group_ratio": (ZERO_ADV_GROUP_RATIO, {}),
    "grad_norm": (GRAD_NORM, {}),
    "pg_loss": (PG_LOSS, {}),
    "samples_fresh": (VERSION_LAG, {"lag": "0"}),
    "samples_stale": (VERSION_LAG, {"lag": "stale"}),
    "version_mismatch": (VERSION_LAG, {"lag": "beyond"}),
}


def export_step(record: dict[str, float]) -> None:
    """Set the gauges of one step's record (unknown keys are ignored)."""
    for key, (gauge, labels) in STEP_GAUGES.items():
        if key in record:
            (gauge.labels(**labels) if labels else gauge).set(record[key])


# -- run progress (owner: controller) ---------------------------------------------------------
STEP_SECONDS = FigureGauge("magic_step_seconds", "Duration of the last on-policy step by phase", ["phase"])
STAGE = FigureGauge("magic_stage", "Index of the current stage in the run's plan")
CONTEXT_LENGTH = FigureGauge("magic_context_length", "Context length T of the current stage (tokens)")
POLICY_VERSION = FigureGauge("magic_policy_version", "Policy version the rollout workers serve")
STEP = FigureGauge("magic_step", "Current on-policy step")
LIVE_WORKERS = FigureGauge("magic_live_workers", "Workers with a fresh heartbeat", ["service"])
STREAM_LENGTH = FigureGauge("magic_stream_length", "Entries in a run stream", ["stream"])
STREAM_PENDING = FigureGauge("magic_stream_pending", "Entries delivered but not yet acknowledged", ["stream"])
# held-out validation (`magic.controller.validation`), per validation dataset, of the policy
# version in magic_validation_policy_version (= the step whose record carries the figures)
VALIDATION_AVG = FigureGauge("magic_validation_avg_at_n", "Held-out avg@n: mean correctness of the n samples per validation prompt, over prompts", ["dataset"])
VALIDATION_MAJ = FigureGauge("magic_validation_maj_at_n", "Held-out maj@n: the majority answer of the n samples per validation prompt is correct, mean over prompts", ["dataset"])
VALIDATION_PASS = FigureGauge("magic_validation_pass_at_k", "Held-out pass@k (Chen et al. 2021 unbiased estimator), mean over validation prompts", ["dataset"])
VALIDATION_PASS_CI = FigureGauge("magic_validation_pass_at_k_ci", "Bounds of the 95% normal confidence interval of pass@k over validation prompts", ["dataset", "bound"])
VALIDATION_LENGTH = FigureGauge("magic_validation_response_length_tokens", "Mean response length of the validation samples (tokens)", ["dataset"])
VALIDATION_TRUNCATED = FigureGauge("magic_validation_truncated_ratio", "Fraction of validation samples truncated at T", ["dataset"])
VALIDATION_VERSION = FigureGauge("magic_validation_policy_version", "Policy version (step) the magic_validation_* figures are of", ["dataset"])
STREAM_LAG = FigureGauge("magic_stream_lag", "Entries not yet delivered to the stream's consumer group (Redis 7 XINFO GROUPS lag)", ["stream"])

# -- service figures --------------------------------------------------------------------------
ROLLOUT_TOKENS = Counter("magic_rollout_tokens", "Response tokens generated")
ROLLOUT_TOKENS_PER_SECOND = FigureGauge("magic_rollout_tokens_per_second", "Response tokens generated per second by this worker over the last 10 s")
ROLLOUT_GENERATION_SECONDS = Histogram(
    "magic_rollout_generation_seconds",
    "Wall time to generate one prompt group, from admission to its last sample",
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 1800, 3600),
)
ROLLOUT_QUEUE_WAIT_SECONDS = Histogram(
    "magic_rollout_queue_wait_seconds",
    "Time a prompt group waited between its publication and its admission into an engine",
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 900),
)
ROLLOUT_IN_FLIGHT = FigureGauge("magic_rollout_in_flight_sequences", "Sequences this rollout worker is generating now")
ROLLOUT_WEIGHT_VERSION = FigureGauge("magic_rollout_weight_version", "Policy version this rollout worker serves")
ROLLOUT_STOLEN_GROUPS = Counter("magic_rollout_stolen_groups", "Straggling prompt groups taken over from another live worker")
ROLLOUT_STALE_GROUPS = Counter("magic_rollout_stale_groups", "Prompt groups dropped because they asked for an older policy version")
WEIGHT_LOAD_SECONDS = Histogram(
    "magic_weight_load_seconds", "Time for a rollout worker to load a weight version", buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)
)
REWARD_LATENCY = Histogram(
    "magic_reward_latency_seconds", "Time to score one response", ["kind"], buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30)
)
REWARD_VERDICTS = Counter("magic_reward_verdicts", "Scored responses by verdict", ["kind", "verdict"])
REWARD_TIMEOUTS = Counter(
    "magic_reward_timeouts", "Responses that hit a time limit: kind=math (verifier killed at its bound), kind=code (a test's or the total time limit)", ["kind"]
)
REWARD_PENALTIES = Counter("magic_reward_penalties", "Responses given a nonzero penalty, by penalty", ["name"])
REWARD_INFLIGHT = FigureGauge("magic_reward_inflight", "Responses being verified now", ["kind"])
REWARD_JUDGE = Counter(
    "magic_reward_judge", "Math answers the rules rejected that the optional LLM judge was asked about, by outcome (accepted, rejected, undecided, failed)", ["outcome"]
)
CODE_JUDGE_VERDICTS = Counter("magic_code_judge_verdicts", "Programs the code judge ran, by verdict", ["verdict"])
SANDBOX_KILLS = Counter(
    "magic_sandbox_kills",
    "Processes the sandbox killed: reason=test_timeout (a test over its limit), memory_limit (all its processes together), leftover_processes (alive after a test: daemons, fork bombs), total_timeout",
    ["reason"],
)
DEAD_LETTERS = Counter("magic_dead_letters", "Stream entries moved to the dead-letter stream", ["stream"])
ERRORS = Counter("magic_errors", "Errors a worker recovered from", ["service"])
REDIS_REFUSED = Counter("magic_redis_refused_writes", "Writes Redis refused at maxmemory (each is retried; see magic.store.client)")


OWNERS: dict[str, tuple[MetricWrapperBase, ...]] = {
    "learner": (
        *{gauge for gauge, _ in STEP_GAUGES.values()},
        VERSION_MISMATCH,
        LEARNER_STEP,
    ),
    "controller": (
        STEP_SECONDS, STAGE, CONTEXT_LENGTH, POLICY_VERSION, STEP, LIVE_WORKERS, STREAM_LENGTH, STREAM_PENDING, STREAM_LAG,
        VALIDATION_AVG, VALIDATION_MAJ, VALIDATION_PASS, VALIDATION_PASS_CI, VALIDATION_LENGTH, VALIDATION_TRUNCATED, VALIDATION_VERSION,
    ),
    "rollout": (
        ROLLOUT_TOKENS,
        ROLLOUT_TOKENS_PER_SECOND,
        ROLLOUT_GENERATION_SECONDS,
        ROLLOUT_QUEUE_WAIT_SECONDS,
        ROLLOUT_IN_FLIGHT,
        ROLLOUT_WEIGHT_VERSION,
        ROLLOUT_STOLEN_GROUPS,
        ROLLOUT_STALE_GROUPS,
        WEIGHT_LOAD_SECONDS,
    ),
    "reward": (REWARD_LATENCY, REWARD_VERDICTS, REWARD_TIMEOUTS, REWARD_PENALTIES, REWARD_INFLIGHT, REWARD_JUDGE),
    "codejudge": (CODE_JUDGE_VERDICTS, SANDBOX_KILLS),
}
"""The series each service computes. DEAD_LETTERS and ERRORS belong to every service (any stream
consumer dead-letters; every worker counts its errors); a metric added above without an owner
here is exported by every process."""

SHARED: tuple[MetricWrapperBase, ...] = (DEAD_LETTERS, ERRORS)


@lru_cache(maxsize=None)
def registry_of(service: str) -> CollectorRegistry:
    """The registry a `service` process exposes on /metrics: the series it owns, the ones every
    service shares or nobody claims, and the process/platform/GC collectors."""
    owned = {id(m) for metrics in OWNERS.values() for m in metrics}
    mine = list(OWNERS.get(service, ())) + [m for m in _magic_collectors() if id(m) not in owned]
    registry = CollectorRegistry(auto_describe=True)
    for collector in dict.fromkeys([*mine, *SHARED, PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR]):
        registry.register(collector)
    return registry


def _magic_collectors() -> list:
    """Every `magic_*` collector of the default registry, in registration order."""
    return list(dict.fromkeys(c for name, c in REGISTRY._names_to_collectors.items() if name.startswith("magic_")))


def declare_service(service: str) -> None:
    """Create this process's labelled series at 0, so that dashboards show 0 rather than no data
    before the first error (Prometheus' advice: initialise the label values you know in advance)."""
    ERRORS.labels(service=service)


# -- the HTTP endpoint ------------------------------------------------------------------------


def serve_http(
    port: int,
    ready: Callable[[], bool],
    host: str = "0.0.0.0",
    idle_timeout_seconds: float = 30.0,
    registry: CollectorRegistry = REGISTRY,
    stalled: Callable[[], str | None] = lambda: None,
) -> ThreadingHTTPServer:
    """Serve GET /metrics, /livez and /readyz on `port` (`magic.runtime.httpserver`); returns the
    server. The port serves nothing else, so it can be opened to Prometheus alone (the reward
    service's POST /v1/score has its own port: `magic.reward.api.serve_score`). /livez answers 503
    with the reason while `stalled()` says why the process is hung
    (`magic.runtime.liveness.LoopWatch.stalled`)."""

    def livez() -> tuple[int, bytes, str]:
        why = stalled()
        return (200, b"ok\n", "text/plain") if why is None else (503, f"hung: {why}\n".encode(), "text/plain")

    def readyz() -> tuple[int, bytes, str]:
        return (200, b"ready\n", "text/plain") if ready() else (503, b"not ready\n", "text/plain")

    routes = {"/metrics": lambda: (200, generate_latest(registry), CONTENT_TYPE_LATEST), "/livez": livez, "/readyz": readyz}
    return httpserver.serve(port, "metrics-http", get=routes, host=host, idle_timeout_seconds=idle_timeout_seconds)
