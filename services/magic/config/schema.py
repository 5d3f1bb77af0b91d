"""The run schema: the training job, declared once.

`RunSpec`, `StageConfig` and `OptimConfig` describe the training job. The REST API accepts
them, the CLI generates its flags from them (`magic.config.flags`), the controller stores the
spec in Redis and writes each step's `StageConfig` into the step's record, which the learner and
the rollout workers read back — one schema everywhere. (Process settings — where Redis is, which
port — are not part of it: `magic.config.settings` and each service's `settings` module.)

The paper's symbols map onto field names once, here (each is also accepted as an alias):

=============  =======================  =====================================================
paper          field                    meaning
=============  =======================  =====================================================
T              ``context_length``       max response tokens; longer responses are truncated
D_R            ``rollout_batch_size``   prompts rolled out per on-policy step
gs             ``group_size``           samples per prompt (the GRPO group)
tau            ``temperature``          sampling temperature (also used for train logprobs)
eps_low/high   ``clip_low/clip_high``   PPO clip range [1 - clip_low, 1 + clip_high]
D_T            ``train_batch_size``     prompts per SGD mini-batch (default D_R)
N_reuse        ``reuse``                passes over each rollout batch
tgt_ent        ``entropy.target``       target entropy of adaptive entropy control
Delta          ``entropy.delta``        step of the adaptive entropy coefficient
beta           ``kl_coef``              weight of the k3 KL to the reference policy
=============  =======================  =====================================================
"""

from __future__ import annotations

import fnmatch
from enum import Enum
from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator


class PenaltySettings(BaseModel):
    """Optional reward penalties (`magic.reward.penalties`), each reported separately from
    correctness. Env: ``MAGIC_PENALTIES__<FIELD>`` (the reward service's default), or per stage
    (`StageConfig.penalties`, carried on every prompt group). All are off by default, as in
    Skywork-OR1."""

    model_config = ConfigDict(extra="forbid")

    repetition_max: float = Field(default=0.0, ge=0, le=10)
    """Largest repetition penalty (subtracted from the reward); 0 disables it."""
    repetition_ngram: int = Field(default=3, ge=1, le=64)
    """Size of the word n-grams counted for repetition."""
    overlong_buffer_tokens: int = Field(default=0, ge=0)
    """Soft overlong punishment (DAPO): the last this many tokens before the context length T
    cost up to `overlong_max`, linearly; 0 disables it."""
    overlong_max: float = Field(default=1.0, ge=0, le=10)
    """Penalty of a response that reaches T (and of a truncated one)."""
    repetition_flat: bool = False
    """Flat repetition penalty (the RLOO + entropy bonus + penalties recipe): a response whose
    repeated-n-gram fraction reaches `repetition_threshold` gets exactly -repetition_max, any
    other 0; False grades it: -repetition_max * (repeated fraction)."""
    repetition_threshold: float = Field(default=0.5, gt=0, le=1)
    """Repeated-n-gram fraction (1 - distinct / total word n-grams) at which a response counts as
    repetitive for the flat penalty."""


def _alias(name: str, symbol: str) -> AliasChoices:
    return AliasChoices(name, symbol)


class AdvantageEstimator(str, Enum):
    grpo = "grpo"
    """GRPO group normalisation: (r - mean_group) / (std_group + eps) (paper eq. 2.5)."""
    drgrpo = "drgrpo"
    """Dr.GRPO: r - mean_group, no division by the std."""
    rloo = "rloo"
    """RLOO: r minus the mean of the other samples of the group."""
    batch = "batch"
    """Batch-level normalisation: mean and std over the whole rollout batch."""
    lite_ppo = "lite_ppo"
    """LitePPO: group mean, batch (global) std."""


class AdvantageMask(str, Enum):
    none = "none"
    """Truncated responses keep their (negative) advantage — the recipe's choice (§3.2.3)."""
    before = "before"
    """Truncated responses are left out of the group statistics and get advantage 0 (§3.2.3)."""
    after = "after"
    """Truncated responses count in the group statistics, then get advantage 0 (§3.2.3)."""


class EntropyControl(BaseModel):
    """Adaptive entropy control (§3.2.5): alpha_k = c_k * 1{e_k <= tgt_ent},
    c_{k+1} = c_k + Delta if e_k < tgt_ent, c_k - Delta if e_k > tgt_ent, c_0 = 0, c kept in bounds."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False, use_attribute_docstrings=True)

    adaptive: bool = True
    """Adapt the coefficient as above; False uses `coef` as a constant entropy-bonus coefficient."""
    target: float = Field(default=0.2, ge=0, validation_alias=_alias("target", "tgt_ent"))
    """tgt_ent: target (lower bound) for the policy entropy, nats per token."""
    delta: float = Field(default=0.005, ge=0, validation_alias=_alias("delta", "Delta"))
    """Delta: step of the adaptive coefficient per on-policy step."""
    coef_min: float = Field(default=0.0, ge=0)
    """Lower bound of c_k."""
    coef_max: float = Field(default=0.1, ge=0)
    """Upper bound of c_k."""
    coef: float = Field(default=0.0, ge=0)
    """Constant coefficient when `adaptive` is False (0 disables the entropy bonus)."""

    @model_validator(mode="after")
    def _bounds(self) -> "EntropyControl":
        if self.coef_min > self.coef_max:
            raise ValueError(f"entropy.coef_min ({self.coef_min}) must not exceed entropy.coef_max ({self.coef_max})")
        return self


class PlateauRule(BaseModel):
    """Ends a stage early once a per-step figure stops improving: after at least `min_steps`
    steps, the mean of `metric` over the last `window` steps is compared with the mean over the
    `window` steps before them; the stage ends when it rose by less than `min_delta`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True)

    metric: Literal["accuracy_all", "accuracy_nontruncated", "reward_mean"] = "accuracy_all"
    """Step record figure watched (rollout accuracy by default)."""
    window: int = Field(default=5, ge=1, le=10_000)
    """Steps per window."""
    min_delta: float = Field(default=0.01, ge=0)
    """Smallest rise of the window mean that counts as progress."""
    min_steps: int = Field(default=0, ge=0)
    """Steps the stage runs before the rule is checked (at least 2 * window in any case)."""


class StageConfig(BaseModel):
    """One training stage: a context length T and the batch settings used until its end condition."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False, use_attribute_docstrings=True)

    name: str = Field(default="stage", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Label shown in status and metrics (letters, digits, `_`, `.`, `-`)."""
    steps: int = Field(ge=1, le=1_000_000)
    """End condition: the most on-policy steps this stage runs (all of them without `plateau`)."""
    plateau: PlateauRule | None = None
    """End condition: end the stage before `steps` once `plateau.metric` stops improving."""
    checkpoint_at_end: bool = True
    """Checkpoint the policy this stage ends with (verl saves the last step too), beside the
    learner's every `checkpoint_every`-th; the plan's end is its last stage's end."""
    online_filter: bool = True
    """At this stage's start, drop the prompts the policy solved in every sample during the
    previous stage (online filtering, §6); no effect on the first stage."""
    context_length: int = Field(ge=1, le=1_048_576, validation_alias=_alias("context_length", "T"))
    """T: max response tokens; responses longer than T are truncated (finish reason `length`)."""
    rollout_batch_size: int = Field(ge=1, le=65_536, validation_alias=_alias("rollout_batch_size", "D_R"))
    """D_R: prompts rolled out per on-policy step."""
    group_size: int = Field(ge=2, le=1024, validation_alias=_alias("group_size", "gs"))
    """gs: samples per prompt; GRPO normalises rewards within each group."""
    temperature: float = Field(default=1.0, gt=0, le=10, validation_alias=_alias("temperature", "tau"))
    """tau: sampling temperature; the learner divides logits by it too, so ratios match the sampler."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling mass (1.0 = off, as in the recipe)."""
    lr: float = Field(default=1e-6, gt=0, le=1)
    """Learning rate of the optimizer during this stage."""
    clip_low: float = Field(default=0.2, gt=0, lt=1)
    """eps_low: the ratio is clipped below at 1 - clip_low."""
    clip_high: float = Field(default=0.28, gt=0, le=10)
    """eps_high: the ratio is clipped above at 1 + clip_high (clip-higher when > clip_low)."""
    advantage_estimator: AdvantageEstimator = AdvantageEstimator.grpo
    """How rewards become advantages."""
    advantage_mask: AdvantageMask = AdvantageMask.none
    """Advantage mask for truncated responses (§3.2.3)."""
    train_batch_size: int | None = Field(default=None, ge=1, le=65_536, validation_alias=_alias("train_batch_size", "D_T"))
    """D_T: prompts per SGD mini-batch; None means D_R (one SGD step per rollout batch)."""
    reuse: int = Field(default=1, ge=1, le=64, validation_alias=_alias("reuse", "N_reuse"))
    """N_reuse: passes over each rollout batch; N_SGD = D_R / D_T * N_reuse (eq. 4.1)."""
    dual_clip: float | None = Field(default=None, gt=1)
    """c of dual-clip PPO: for negative advantages the per-token loss is capped at -c * A; None disables it."""
    entropy: EntropyControl = Field(default_factory=EntropyControl)
    """Entropy bonus alpha_k * H (§3.2.5)."""
    kl_coef: float = Field(default=0.0, ge=0, validation_alias=_alias("kl_coef", "beta"))
    """beta: weight of the k3 KL to the reference policy (§3.2.6); 0 in the recipe."""
    rollout_is: Literal["none", "truncate", "mask"] = "none"
    """Correction for the sampler/learner mismatch (vLLM samples in bf16 with its own kernels, so
    its log-probs of policy version k differ from the learner's): each token's policy-gradient
    term is weighted by w = pi_learner / pi_sampler of the sampled token — "truncate": min(w, C)
    (truncated importance sampling); "mask": w where 1/C <= w <= C, else 0; "none" (the paper's
    recipe): no weight. The mismatch (`kl_rollout`) and the share of tokens beyond C
    (`rollout_is_clipfrac`) are recorded in every mode. verl's `rollout_is` / `rollout_is_threshold`."""
    rollout_is_threshold: float = Field(default=2.0, gt=1, le=1000)
    """C: the cap of the importance weights of `rollout_is`."""
    max_staleness: int = Field(default=0, ge=0, le=8)
    """s: bounded staleness (off-policy by at most s versions; docs/overlap.md). 0, the paper's
    recipe: step k trains only samples of policy version k, and the controller publishes step
    k + 1 once every rollout worker serves version k + 1. With s >= 1 the controller publishes
    step k + 1 while the learner still trains step k (at most s steps ahead; never across a
    stage's end, a validation or a requested evaluation), its samples may come from versions
    k + 1 - s ... k + 1, and the learner trains a sample of an older version with the decoupled
    PPO objective: the ratio around its own policy (version k + 1), each token weighted by
    pi_learner / pi_sampler truncated at C (`rollout_is_threshold`; "mask" with `rollout_is`
    "mask"). Samples older than s versions are never trained (counted in `version_mismatch`)."""
    kl_reference: Literal["initial", "ema"] = "initial"
    """The reference policy of the KL term (beta > 0): "initial", the run's initial model; "ema",
    an exponential moving average of the policy, pi_ref <- d * pi_ref + (1 - d) * pi_theta after
    every on-policy step (d = `kl_ema_decay`), starting from the initial model."""
    kl_ema_decay: float = Field(default=0.99, ge=0, lt=1)
    """d: decay of the EMA reference policy per on-policy step (kl_reference "ema")."""
    minibatch_rule: Literal["count", "size", "slot"] = "count"
    """How the groups kept after rejection become SGD mini-batches. "count": always D_R / D_T
    mini-batches per pass (whole groups split as evenly as possible; by samples when fewer
    groups than mini-batches are left), so N_SGD = D_R / D_T * N_reuse exactly (eq. 4.1).
    "size": mini-batches of D_T prompts, so rejection lowers N_SGD (the last one may be smaller).
    "slot": mini-batch j holds the kept groups among the published prompts j * D_T ... (j + 1) * D_T - 1
    (sizes vary with rejection): a group's mini-batch is known when it arrives, so with N_SGD > 1
    the first mini-batch streams too (docs/overlap.md)."""
    penalties: PenaltySettings | None = None
    """Reward penalties of this stage, carried on each prompt group to the reward service; None
    leaves the reward service's own settings (MAGIC_PENALTIES__*)."""

    @model_validator(mode="before")
    @classmethod
    def _flat_entropy_symbols(cls, data: object) -> object:
        """The paper's tgt_ent and Delta may be given flat on the stage (as in its tables)."""
        if isinstance(data, dict) and ("tgt_ent" in data or "Delta" in data):
            data = dict(data)
            entropy = data.get("entropy")
            entropy = dict(entropy) if isinstance(entropy, dict) else ({} if entropy is None else entropy)
            if isinstance(entropy, dict):
                for symbol, field in (("tgt_ent", "target"), ("Delta", "delta")):
                    if symbol in data:
                        if field in entropy or symbol in entropy:
                            raise ValueError(f"{symbol} is given twice: flat and as entropy.{field}")
                        entropy[field] = data.pop(symbol)
                data["entropy"] = entropy
        return data

    @field_validator("train_batch_size")
    @classmethod
    def _d_t_divides_d_r(cls, v: int | None, info: ValidationInfo) -> int | None:
        d_r = info.data.get("rollout_batch_size")
        if v is None or d_r is None:
            return v
        if v > d_r:
            raise ValueError(f"D_T = {v} is larger than D_R = {d_r}: a mini-batch cannot hold more prompts than the rollout batch")
        if d_r % v:
            raise ValueError(f"D_R = {d_r} is not divisible by D_T = {v}: pick a D_T that divides D_R (N_SGD = D_R / D_T * N_reuse)")
        return v

    @field_validator("plateau")
    @classmethod
    def _plateau_fits(cls, v: PlateauRule | None, info: ValidationInfo) -> PlateauRule | None:
        steps = info.data.get("steps")
        if v is not None and steps is not None and 2 * v.window > steps:
            raise ValueError(f"plateau.window = {v.window} needs 2 * window <= steps = {steps} steps to compare two windows")
        return v

    @field_validator("penalties")
    @classmethod
    def _overlong_buffer_fits(cls, v: PenaltySettings | None, info: ValidationInfo) -> PenaltySettings | None:
        t = info.data.get("context_length")
        if v is not None and t is not None and v.overlong_buffer_tokens >= t:
            raise ValueError(
                f"penalties.overlong_buffer_tokens = {v.overlong_buffer_tokens} is not below T = {t}: every response would be "
                f"penalised as overlong; use a buffer below T (DAPO: a fraction of T, e.g. {t // 4})"
            )
        return v

    @property
    def n_minibatches(self) -> int:
        """D_R / D_T: SGD mini-batches per pass over the rollout batch."""
        return self.rollout_batch_size // (self.train_batch_size or self.rollout_batch_size)

    @property
    def n_sgd(self) -> int:
        """N_SGD = D_R / D_T * N_reuse (paper eq. 4.1); 1 is the on-policy case."""
        return self.n_minibatches * self.reuse


class OptimConfig(BaseModel):
    """AdamW settings shared by every stage (the learning rate is per stage)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.999)
    """Adam's beta1, beta2."""
    eps: float = Field(default=1e-8, gt=0)
    """Adam's epsilon."""
    weight_decay: float = Field(default=0.0, ge=0)
    """Decoupled weight decay."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Gradients are clipped to this global L2 norm."""


RunName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]


PlanEnd = Literal["finish", "wait"]
"""What a run does when its last stage ends: "finish", or "wait" for the next stage."""


def duplicate_stage_name(names: list[str], taken: set[str] | frozenset[str] = frozenset()) -> str | None:
    """The first of `names` that repeats an earlier one or is in `taken` (a run's stage names are
    unique: they label metrics and stage records); None if all are new."""
    seen = set(taken)
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def require_unique_stage_names(names: list[str]) -> None:
    """The validators' check (a run's spec, a plan to append): ValueError naming the repeated name."""
    if (dup := duplicate_stage_name(names)) is not None:
        raise ValueError(f"stage names must be unique within a run: {dup!r} is given twice in {names}")


DatasetName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$")]


class DatasetSpec(BaseModel):
    """A training dataset to register: a JSONL or Parquet file of verl / Skywork-OR1 records
    (`prompt`, `data_source`, `reward_model.ground_truth`, `extra_info`) on a path the controller reads."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: DatasetName
    """Dataset id: lowercase letters, digits, `_`, `.`, `-`."""
    path: str = Field(min_length=1, max_length=4096)
    """File path as the controller sees it (the shared volume on Kubernetes)."""
    format: Literal["auto", "jsonl", "parquet"] = "auto"
    """File format; "auto" picks it from the extension (.jsonl/.json, .parquet)."""


class EstimationConfig(BaseModel):
    """Offline difficulty estimation (§6): sample each prompt N times with the current policy
    and drop the prompts solved 0/N or N/N times from the next stages."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    samples: int = Field(default=16, ge=2, le=1024, validation_alias=_alias("samples", "N"))
    """N: samples per prompt (of every data source `samples_by_source` does not name)."""
    samples_by_source: dict[str, Annotated[int, Field(ge=2, le=1024)]] = Field(default_factory=dict, max_length=64)
    """N per data source: `data_source` pattern (fnmatch, case-insensitive) -> N, first match
    wins, e.g. {"*code*": 8} with samples 16 (the paper: 16 samples for math, 8 for code)."""
    context_length: int = Field(ge=1, le=1_048_576, validation_alias=_alias("context_length", "T"))
    """T: max response tokens of the estimation samples."""
    temperature: float = Field(default=1.0, gt=0, le=10, validation_alias=_alias("temperature", "tau"))
    """tau: sampling temperature."""
    max_prompts: int | None = Field(default=None, ge=1)
    """Estimate only the first this many prompts of the pool (None: all of them)."""
    groups_per_batch: int = Field(default=64, ge=1, le=100_000)
    """Prompt groups published at once (bounds the prompts stream)."""

    def samples_for(self, data_source: str) -> int:
        """N for a prompt of `data_source`.

        >>> EstimationConfig(T=8, N=16, samples_by_source={"*code*": 8}).samples_for("LiveCodeBench")
        8
        """
        ds = data_source.lower()
        return next((n for p, n in self.samples_by_source.items() if fnmatch.fnmatchcase(ds, p.lower())), self.samples)


class EvalConfig(BaseModel):
    """What one held-out evaluation of a policy samples and reports: each prompt of the datasets
    `samples` times through the rollout and reward services (never reaching the learner); per
    dataset avg@n, pass@k with a 95% confidence interval, maj@n, mean response length and truncated
    share (`magic.evaluation`). The body of POST /v1/runs/{run}/evals; in-run validation adds
    `every` (`ValidationConfig`)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False, use_attribute_docstrings=True)

    datasets: list[DatasetName] = Field(min_length=1, max_length=16)
    """Registered dataset names (POST /v1/datasets) whose records all carry a ground truth."""
    samples: int = Field(default=4, ge=1, le=1024, validation_alias=_alias("samples", "n"))
    """n, samples per prompt (avg@n; the paper writes avg@k). Also accepted as `n`; `k` is refused
    (it names pass@k's k: `pass_k`)."""
    pass_k: int | None = Field(default=None, ge=1, le=1024)
    """The k of the reported pass@k (Chen et al. unbiased estimator); None: `samples`."""
    temperature: float = Field(default=1.0, ge=0, le=10, validation_alias=_alias("temperature", "tau"))
    """tau of the samples (the paper evaluates at tau = 1); 0: greedy decoding (then one sample per
    prompt: every sample would be the same)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling mass of the samples."""
    context_length: int | None = Field(default=None, ge=1, le=1_048_576, validation_alias=_alias("context_length", "T"))
    """T of the samples; None: the T of the run's current stage when the evaluation is served (a
    validation before step k: the T of the stage step k belongs to)."""
    max_prompts: int | None = Field(default=None, ge=1, le=1_000_000)
    """Evaluate only the first this many prompts of each dataset (None: all of them)."""

    @model_validator(mode="before")
    @classmethod
    def _no_k(cls, data):
        if isinstance(data, dict) and "k" in data:
            raise ValueError("`k` is ambiguous here: the samples per prompt are `samples` (or `n`), pass@k's k is `pass_k`")
        return data

    @model_validator(mode="after")
    def _k_fits(self) -> "EvalConfig":
        if self.pass_k is not None and self.pass_k > self.samples:
            raise ValueError(f"pass_k = {self.pass_k} exceeds samples = {self.samples}: pass@k needs k <= n samples per prompt")
        if len(set(self.datasets)) != len(self.datasets):
            raise ValueError(f"datasets names a dataset twice: {self.datasets}")
        if self.temperature == 0 and self.samples != 1:
            raise ValueError(f"tau = 0 is greedy decoding: every sample of a prompt would be the same; set samples to 1 (got {self.samples})")
        return self

    @property
    def k(self) -> int:
        """The k of the reported pass@k."""
        return self.pass_k or self.samples


MAX_DUMPED_SAMPLES = 100_000
"""The most samples one validation writes to its generations file (`dump_prompts`)."""


class ValidationConfig(EvalConfig):
    """Held-out validation during the run (verl's `test_freq`, Skywork-OR1's avg@k curves): every
    `every` steps — and before the first — the controller evaluates the current policy version as
    `EvalConfig` says, and records the figures in the step record, `metrics.jsonl` and the
    magic_validation_* series."""

    every: int = Field(default=10, ge=1, le=1_000_000)
    """Validate the policy version of every step k with k % every == 0 (step 0: the initial model)."""
    before_training: bool = True
    """Validate the initial model before the first step (verl's `val_before_train`); false: the
    first point of the curve is step `every`'s."""
    dump_prompts: int = Field(default=0, ge=0, le=10_000)
    """Write every sample of the first this many prompts of each dataset — prompt, response,
    extracted answer, verdict, tokens, truncated — to DATA_DIR/runs/<run>/generations/step-<K>.jsonl
    for each validation of version K (verl's `validation_data_dir`; responses cut at 64k
    characters); 0: none."""
    best_by: str | None = Field(default=None, pattern=r"^([a-z0-9][a-z0-9._-]*:)?(avg_at_n|pass_at_k|maj_at_n)$")
    """Keep the checkpoint of the best validation so far (OpenRLHF's / TRL's
    `metric_for_best_model`): `avg_at_n`, `pass_at_k` or `maj_at_n` of the first dataset, or `DATASET:FIGURE`;
    higher is better. Each new best is checkpointed and kept whatever `keep_checkpoints` says;
    GET /v1/runs/{run} names it (`best`). None: no best is kept."""

    @model_validator(mode="after")
    def _best_names_a_dataset(self) -> "ValidationConfig":
        if self.best_by and ":" in self.best_by and self.best_by.split(":")[0] not in self.datasets:
            raise ValueError(f"best_by {self.best_by!r} names a dataset this validation does not evaluate ({', '.join(self.datasets)})")
        if (rows := self.dump_prompts * self.samples * len(self.datasets)) > MAX_DUMPED_SAMPLES:
            raise ValueError(f"dump_prompts x samples x datasets = {rows} samples a validation would write; at most {MAX_DUMPED_SAMPLES}")
        return self

    def best_figure(self, figures: dict[str, dict]) -> float | None:
        """The figure `best_by` names, from one validation's figures (None without `best_by`)."""
        if not self.best_by:
            return None
        dataset, _, figure = self.best_by.rpartition(":")
        return float(figures[dataset or self.datasets[0]][figure])


class RunSpec(BaseModel):
    """A training run: the initial model, the training prompts and the stage plan."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    name: RunName
    """Run id: lowercase letters, digits and dashes (it appears in Redis keys and paths)."""
    model: str = Field(min_length=1, max_length=4096)
    """Initial policy: a Hugging Face model directory readable by the controller, learner and rollout workers."""
    datasets: list[str] = Field(min_length=1, max_length=64, validation_alias=_alias("datasets", "train_files"))
    """Training prompts: names of registered datasets (POST /v1/datasets), or file paths, which
    are registered on the fly under their file stem. Also accepted as `train_files`."""
    stages: list[StageConfig] = Field(default_factory=list, max_length=1000)
    """The stage plan, run in order; more stages can be appended while the run goes."""
    on_plan_end: PlanEnd | None = None
    """What the run does when its last stage ends: "finish", or "wait" for the next stage
    (POST /v1/runs/{run}/stages). Default: "finish" when stages are given, else "wait"."""
    estimation: EstimationConfig | None = None
    """Offline difficulty estimation before the first step (None: none)."""
    validation: ValidationConfig | None = None
    """Held-out validation every `validation.every` steps (None: none)."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    seed: int = Field(default=0, ge=0, le=2**62)
    """Seeds prompt order and sampling."""

    @model_validator(mode="after")
    def _unique_stage_names(self) -> "RunSpec":
        require_unique_stage_names([s.name for s in self.stages])
        if self.on_plan_end is None:
            self.on_plan_end = "finish" if self.stages else "wait"
        if self.validation is not None and self.stages and self.validation.every > self.total_steps:
            raise ValueError(
                f"validation.every = {self.validation.every} is longer than the plan ({self.total_steps} steps): only the initial "
                f"policy would be validated; use every <= {self.total_steps}"
            )
        return self

    @property
    def total_steps(self) -> int:
        """Steps of the plan if every stage runs all its `steps` (an upper bound with plateau rules)."""
        return sum(s.steps for s in self.stages)

    def stage_at(self, step: int) -> tuple[int, StageConfig]:
        """The stage index and config that global step `step` (0-based) belongs to when every stage
        runs all its `steps`. The controller decides the real boundaries (plateau rules end stages
        early) and writes each step's stage into the step hash (`RunKeys.step`, field `stage_config`),
        which is what workers should read."""
        for i, stage in enumerate(self.stages):
            if step < stage.steps:
                return i, stage
            step -= stage.steps
        raise ValueError("step is past the end of the plan")
