"""Command-line options of `magic local` (apart from its launcher, which imports the services' code).

The stage settings are generated from `StageConfig` (`magic.config.flags`), so every field of
the schema is a flag here as in `magic stage start`; `LOCAL_STAGE` holds the few values the
tiny model needs instead of the schema's defaults (which suit 7B-32B models), declared once.
"""

from __future__ import annotations

import argparse

from magic.config.files import load_file
from magic.config.flags import add_model_flags, merge, model_overrides
from magic.config.schema import StageConfig

LOCAL_STAGE = {
    "rollout_batch_size": 64,
    "group_size": 8,
    "temperature": 1.0,
    "lr": 3e-4,  # high for RL, right for a model this small: the default plan learns in 40 steps
    # the tiny model's per-token entropy is about 0.15, below the paper's 0.2 for 7B-32B models,
    # which would keep the entropy bonus on at every step
    "entropy": {"adaptive": True, "target": 0.1},
}
"""Settings of every stage of the default plan (and defaults under a --stages file)."""

DEFAULT_PLAN = ({"name": "stage1", "context_length": 72, "share": 0.4}, {"name": "stage2", "context_length": 96, "share": 0.6})
"""The default two-stage plan: T = 72 truncates the longest worked solutions, T = 96 fits them;
`share` is each stage's part of --steps."""
DEFAULT_STEPS = 40


def at_least(low: float, kind: type = int):
    """An argparse type: a number of `kind` no smaller than `low` (exit 2 naming the flag otherwise)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        if not value >= low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse's own messages name the type
    return parse


POSITIVE, NATURAL = at_least(1), at_least(0)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = (
        "Runs the whole MAGIC loop on this machine: a private redis-server, the four services as processes, the tiny "
        "demo model (warm-started once and cached), a two-stage plan (T = 72, then 96), held-out accuracy before and after."
    )
    first = p.add_argument_group("the knobs to turn first")
    first.add_argument("--steps", type=POSITIVE, default=None, help=f"on-policy steps of the whole plan, split 40%%/60%% over its two stages (default: {DEFAULT_STEPS})")
    first.add_argument(
        "--stages", default=None, metavar="FILE",
        help="the stage plan as a JSON/YAML file (a list of StageConfig, or {\"stages\": [...]}) instead of the default two stages; "
        "stage flags below override every stage's fields",
    )
    first.add_argument(
        "--engine", choices=["torch", "vllm"], default="torch",
        help="rollout engine: torch (in the rollout process) or vllm (each rollout process starts and supervises a vLLM server "
        "from .venv-vllm, created on first use with `make vllm-venv`) (default: torch)",
    )
    first.add_argument("--out", default=".magic/local", help="where logs, metrics, the plot and weights go; emptied first (default: .magic/local)")

    plan = p.add_argument_group("the default plan")
    plan.add_argument("--stage1-steps", type=POSITIVE, default=None, help="on-policy steps of stage 1 (default: 40%% of --steps)")
    plan.add_argument("--stage2-steps", type=POSITIVE, default=None, help="on-policy steps of stage 2 (default: the rest of --steps)")
    plan.add_argument("--T1", type=POSITIVE, default=DEFAULT_PLAN[0]["context_length"], help="context length T of stage 1, tokens (default: 72)")
    plan.add_argument("--T2", type=POSITIVE, default=DEFAULT_PLAN[1]["context_length"], help="context length T of stage 2, tokens (default: 96)")

    stage = p.add_argument_group("stage settings (StageConfig), applied to every stage")
    add_model_flags(stage, StageConfig, "stage", defaults=LOCAL_STAGE, skip=frozenset({"name", "steps", "context_length"}))

    more = p.add_argument_group("the rest")
    more.add_argument("--demo-dir", default=".magic/demo", help="cache of the tiny model and data (default: .magic/demo)")
    more.add_argument("--sft-steps", type=POSITIVE, default=None, help="steps of the supervised warm start (default: SFTConfig's; changing it rebuilds the cache)")
    more.add_argument("--run-name", default="local", help="run id (default: local)")
    more.add_argument("--eval-samples", type=POSITIVE, default=4, help="samples per held-out prompt for accuracy (default: 4)")
    more.add_argument("--eval-prompts", type=POSITIVE, default=500, help="held-out prompts to evaluate (default: 500)")
    more.add_argument(
        "--val-every", type=NATURAL, default=10,
        help="in-run held-out validation every this many steps and of the final policy, through the services, plotted in run.png "
        "(avg@--eval-samples on --val-prompts prompts; 0: none) (default: 10)",
    )
    more.add_argument("--val-prompts", type=POSITIVE, default=64, help="held-out prompts of each in-run validation (default: 64)")
    more.add_argument("--rollout-workers", type=POSITIVE, default=1, help="rollout processes (default: 1)")
    more.add_argument("--reward-workers", type=POSITIVE, default=1, help="reward processes (default: 1)")
    more.add_argument("--transport", choices=["filesystem", "http"], default="filesystem", help="how the learner pushes weights to rollout workers each step (default: filesystem)")
    more.add_argument("--seed", type=int, default=0, help="run seed (default: 0)")
    more.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation before and after, and the in-run validation")
    more.add_argument("--timeout", type=at_least(1, float), default=3600, help="give up after this many seconds (default: 3600)")


def stage_plan(args: argparse.Namespace) -> list[dict]:
    """The run's stages: the --stages file or the default two stages, with the stage flags applied."""
    flags = model_overrides(args, StageConfig, "stage")
    if args.stages:
        doc = load_file(args.stages)
        stages = doc.get("stages") if isinstance(doc, dict) else doc
        if not isinstance(stages, list) or not stages or not all(isinstance(s, dict) for s in stages):
            raise ValueError(f"{args.stages}: expected a non-empty list of stages or {{\"stages\": [...]}}")
        return [merge(StageConfig, merge(StageConfig, LOCAL_STAGE, s), flags) for s in stages]
    total = DEFAULT_STEPS if args.steps is None else args.steps
    first = args.stage1_steps if args.stage1_steps is not None else max(1, round(total * DEFAULT_PLAN[0]["share"]))
    second = args.stage2_steps if args.stage2_steps is not None else max(1, total - first)
    shape = [(DEFAULT_PLAN[0]["name"], first, args.T1), (DEFAULT_PLAN[1]["name"], second, args.T2)]
    return [merge(StageConfig, {"name": name, "steps": steps, "context_length": t, **LOCAL_STAGE}, flags) for name, steps, t in shape]
