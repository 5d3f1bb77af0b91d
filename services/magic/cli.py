"""The `magic` command.

Services and the local loop:

    magic serve {controller,rollout,reward,codejudge,learner}   run one service (settings from MAGIC_* env)
    magic demo prepare [--out DIR]                    build the tiny model + data (cached)
    magic local [options]                             the whole loop on this machine

The controller's API (URL from --url or MAGIC_CONTROLLER_URL, token from --token or MAGIC_API_TOKEN):

    magic dataset register NAME PATH                  validate and register a JSONL/Parquet dataset
    magic dataset list
    magic run create -f run.json                      create a run (model, datasets, stage plan)
    magic run list | get RUN | pause RUN | resume RUN | stop RUN
    magic stage start RUN --name s2 --steps 100 --T 16384 --D_R 64 --gs 16 [--tau 1 --lr 1e-6 ...]
    magic plan submit RUN -f plan.json                append several stages that advance by themselves
    magic status RUN [--watch]                        stage, step, version, workers, last step; live view

Held-out evaluation:

    magic eval --run RUN -d DATASET -n 8 [--wait] [--out eval.json]
                                                      avg@n, pass@k (95% CI), length, truncation of the
                                                      run's current policy through the services
    magic eval --local MODEL_OR_CHECKPOINT -d data.jsonl -n 8 [--out eval.json]
                                                      the same on this machine (a checkpoint, an export)
    magic export RUN [--step K] --out DIR [--dtype bfloat16]
                                                      a run's checkpoint as a Hugging Face model directory

Heavy libraries (torch, fastapi) are imported only by the subcommand that needs them. Nothing
imports this module: it is the leaf of the package.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from pydantic import ValidationError

from magic.config.files import load_file
from magic.config.flags import add_model_flags, merge, model_overrides
from magic.config.schema import EvalConfig, StageConfig
from magic.controller.client import ClientError, ControllerClient
from magic.local.options import add_arguments
from magic.protocol.status import TERMINAL, RunStatus
from magic.runtime.exits import Exit, exit_codes_help, exit_for_status

SERVICES = ("controller", "rollout", "reward", "codejudge", "learner")


def _version() -> str:
    """The installed distribution's version (declared once, in pyproject.toml)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("magic-rl")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _add_api_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None, help="controller URL (default: $MAGIC_CONTROLLER_URL or http://127.0.0.1:8080)")
    p.add_argument("--token", default=None, help="API token (default: $MAGIC_API_TOKEN)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="magic",
        description="MAGIC: multi-stage GRPO with adaptive entropy control. Start with `magic local`.",
        epilog=exit_codes_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"magic {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run one service")
    serve.add_argument("service", choices=SERVICES)

    demo = sub.add_parser("demo", help="the tiny demo model and task")
    demo_sub = demo.add_subparsers(dest="demo_command", required=True)
    prep = demo_sub.add_parser("prepare", help="build the tokenizer, model, data and supervised warm start (cached)")
    prep.add_argument("--out", default=".magic/demo", help="output directory (default: .magic/demo)")
    prep.add_argument("--force", action="store_true", help="rebuild even if a cached copy exists")

    local = sub.add_parser("local", help="run the whole loop on this machine (private Redis, all services, tiny model)")
    add_arguments(local)

    dataset = sub.add_parser("dataset", help="register and list datasets")
    ds_sub = dataset.add_subparsers(dest="action", required=True)
    reg = ds_sub.add_parser("register", help="validate a JSONL/Parquet file of verl records and register it")
    reg.add_argument("name")
    reg.add_argument("path", help="file path as the controller sees it")
    reg.add_argument("--format", default="auto", choices=("auto", "jsonl", "parquet"))
    reg.add_argument("--replace", action="store_true", help="replace a dataset registered under the same name")
    ds_list = ds_sub.add_parser("list", help="registered datasets")
    for p in (reg, ds_list):
        _add_api_arguments(p)

    run = sub.add_parser("run", help="create, list and control runs")
    run_sub = run.add_subparsers(dest="action", required=True)
    create = run_sub.add_parser("create", help="create a run from a JSON/YAML spec (name, model, datasets, stages)")
    create.add_argument("-f", "--file", required=True, help="run spec file ('-' for stdin)")
    _add_api_arguments(create)
    run_list = run_sub.add_parser("list", help="all runs")
    _add_api_arguments(run_list)
    for action in ("get", "pause", "resume", "stop"):
        p = run_sub.add_parser(action, help=f"{action} a run")
        p.add_argument("run")
        _add_api_arguments(p)

    stage = sub.add_parser("stage", help="start the next stage of a run")
    stage_sub = stage.add_subparsers(dest="action", required=True)
    start = stage_sub.add_parser("start", help="append a stage (starts when the current stage ends, or now if the run waits)")
    start.add_argument("run")
    start.add_argument("-f", "--file", help="stage config file (JSON/YAML); flags override its fields")
    fields = start.add_argument_group("stage settings (StageConfig; a flag left out keeps the file's value or the schema's default)")
    add_model_flags(fields, StageConfig, "stage")
    fields.add_argument(
        "--plateau", default=None, metavar="METRIC[:WINDOW[:MIN_DELTA]]",
        help="end condition: end the stage early once METRIC stops improving (PlateauRule; parts left out keep its defaults)",
    )
    _add_api_arguments(start)

    plan = sub.add_parser("plan", help="submit a whole stage plan")
    plan_sub = plan.add_subparsers(dest="action", required=True)
    submit = plan_sub.add_parser("submit", help="append stages that advance by themselves")
    submit.add_argument("run")
    submit.add_argument("-f", "--file", required=True, help='{"stages": [...], "on_plan_end": "finish"|"wait"} or a list of stages')
    _add_api_arguments(submit)

    ev = sub.add_parser(
        "eval", help="held-out figures (avg@n, pass@k with a 95%% CI, length, truncation) of a run's policy, a model or a checkpoint",
        description="Samples every prompt of a dataset n times with a policy, verifies every answer and prints avg@n, "
        "pass@k (Chen et al.'s unbiased estimator) with a 95% confidence interval over prompts, the mean response length "
        "and the truncated share (the figures of in-run validation, magic.evaluation); --out writes them as JSON. "
        "--run RUN: the policy version the run's rollout workers serve at its next step boundary (at once while it is paused "
        "or waits), through the rollout and reward services (POST /v1/runs/RUN/evals). --local MODEL_OR_CHECKPOINT: on this "
        "machine. A checkpoint through the services: `magic export` it and create a run with that model and no stages.",
    )
    ev.add_argument("target", nargs="?", default=None, help="with --local: a Hugging Face model directory or a learner checkpoint (DATA_DIR/runs/RUN/checkpoints/step-K)")
    ev.add_argument("--local", action="store_true", help="evaluate on this machine: a torch rollout engine and the reward scorer in-process")
    ev.add_argument("--run", default=None, help="evaluate this run's current policy through the controller's services")
    ev.add_argument("--dataset", "-d", action="append", default=None, help="--run: a registered dataset name (repeatable); --local: one JSONL/Parquet file of verl records with ground truths")
    ev.add_argument("--wait", action="store_true", help="--run: poll until the eval is done, print the table (and write --out)")
    ev.add_argument("--id", dest="eval_id", default=None, help="--run: follow an eval posted before instead of posting one")
    ev.add_argument("--interval", type=float, default=2.0, help="--run --wait: seconds between polls (default: 2)")
    ev.add_argument("--samples", "-n", type=int, default=4, help="n samples per prompt (avg@n; the paper writes avg@k); pass@k's k is --pass-k (default: 4)")
    ev.add_argument("--pass-k", type=int, default=None, help="the k of the reported pass@k, 1 <= k <= n (default: n)")
    ev.add_argument("--temperature", "--tau", type=float, default=1.0, help="sampling temperature (default: 1, the paper's)")
    ev.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default: 1)")
    ev.add_argument("--T", "--max-tokens", dest="max_tokens", type=int, default=None, help="response token limit T (default: the model's context window less the longest prompt, at most 4096)")
    ev.add_argument("--max-prompts", type=int, default=None, help="evaluate only the first this many prompts (default: all)")
    ev.add_argument("--seed", type=int, default=None, help="--local: sampling seed of prompt 0; prompt i gets seed + i (default: 1234; --run: the run's seeds)")
    ev.add_argument("--out", "-o", default=None, help="write the figures as JSON to this file (--local: with every prompt's outcome and answers; --run: the eval's record)")
    _add_api_arguments(ev)

    exp = sub.add_parser(
        "export", help="a run's checkpoint as a Hugging Face model directory (transformers and vLLM load it as is)",
        description="Copies the model of a learner checkpoint (DATA_DIR/runs/RUN/checkpoints/step-K) — config, safetensors "
        "weights, generation config, tokenizer and chat template — without the training state (optimizer, EMA reference, "
        "trainer state), into a directory `from_pretrained` and `vllm serve` load as is.",
    )
    exp.add_argument("run")
    exp.add_argument(
        "--step", type=int, default=None,
        help="the checkpoint of the policy after K steps (policy version K: the one step K's record validates; one is written "
        "every checkpoint_every = 20 steps, at each stage's end and for the best validation) (default: the newest complete checkpoint)",
    )
    exp.add_argument("--out", "-o", required=True, help="the model directory to write (must not exist unless --force)")
    exp.add_argument("--data-dir", default=None, help="the shared volume the learner writes to (default: $MAGIC_DATA_DIR or .magic/data)")
    exp.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None, help="convert the weights (default: as stored, the learner's float32)")
    exp.add_argument("--force", action="store_true", help="replace --out if it exists")

    mem = sub.add_parser(
        "memory", help="the learner's peak memory per GPU and per host for a model and a shape, before paying for GPUs",
        description="Prints the learner's peak memory per GPU (rank 0) and per learner pod, by component, for a model's "
        "config.json and a learner shape (flags, or the chart's values with --values), and exits 1 when it does not fit, "
        "naming the knob to turn (docs/learner.md, \"Memory plan\"). The learner runs the same check when a run starts.",
    )
    mem.add_argument("model", help="a model directory or its config.json (no weights are read)")
    mem.add_argument("--values", "-f", action="append", default=[], help="chart values file(s) to read learner.* from (later files win)")
    mem.add_argument("--T", type=int, default=None, dest="context_length", help="max response tokens T (default: 16384)")
    mem.add_argument("--prompt-tokens", type=int, default=None, help="longest prompt in tokens (default: 2048, as the learner's MAGIC_MAX_PROMPT_TOKENS)")
    mem.add_argument("--gpus", type=int, default=None, help="GPUs (ranks) per learner pod (learner.gpus; 0: CPU)")
    mem.add_argument("--nodes", type=int, default=None, help="learner pods (learner.nodes)")
    mem.add_argument("--zero-stage", type=int, choices=(1, 2, 3), default=None, help="ZeRO stage (learner.zeroStage)")
    mem.add_argument("--precision", choices=("bf16", "fp32"), default=None, help="training precision (learner.precision)")
    mem.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=None, help="learner.activationCheckpointing")
    mem.add_argument("--micro-batch-tokens", type=int, default=None, help="token budget of a micro-batch (learner.microBatchTokens)")
    mem.add_argument("--reference", choices=("none", "initial", "ema"), default="none", help="the KL reference policy a stage uses (beta > 0)")
    mem.add_argument("--gpu-memory", default=None, help="memory of one GPU, e.g. 80GB (learner.gpuMemory)")
    mem.add_argument("--json", action="store_true", help="print the plan as JSON")

    status = sub.add_parser("status", help="a run's stage, step, policy version, workers and last step")
    status.add_argument("run")
    status.add_argument("--watch", "-w", action="store_true", help="refresh until the run ends")
    status.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default: 2)")
    status.add_argument("--json", action="store_true", help="print the raw status JSON")
    _add_api_arguments(status)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve_service(args.service)
    if args.command == "demo":
        from magic.demo.prepare import prepare  # heavy (torch, transformers), as every import below

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
        prepare(args.out, force=args.force, progress=True)
        return 0
    if args.command == "local":
        from magic.local.launcher import launch  # the services' client code and its dependencies: not for `magic --help`

        return launch(args)
    if args.command == "eval":
        return eval_command(args)
    if args.command == "export":
        return export_command(args)
    if args.command == "memory":
        return memory_command(args)
    return api_command(args)


def memory_command(args: argparse.Namespace) -> int:
    """`magic memory`: the learner's memory plan (`magic.learner.memory`); exit 1 when it does not fit."""
    import yaml

    from magic.learner import memory  # as every command's own code: imported when it runs

    def usage(problem: str) -> int:
        print(f"magic memory: {problem}", file=sys.stderr)
        return Exit.usage

    values: dict = {}
    for path in args.values:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            return usage(f"--values {path}: cannot read ({exc.strerror or exc})")
        except yaml.YAMLError as exc:
            return usage(f"--values {path}: not YAML ({str(exc).splitlines()[0]})")
        if not isinstance(loaded, dict):
            return usage(f"--values {path}: not a mapping of chart values")
        if not isinstance(loaded.get("learner") or {}, dict):
            return usage(f"--values {path}: learner: is not a mapping of the learner's values")
        learner = dict(values.get("learner") or {})
        learner.update(loaded.get("learner") or {})
        values.update({k: v for k, v in loaded.items() if k != "learner"})
        values["learner"] = learner
    learner = values.setdefault("learner", {})
    for flag, key in (("gpus", "gpus"), ("nodes", "nodes"), ("zero_stage", "zeroStage"), ("precision", "precision"),
                      ("activation_checkpointing", "activationCheckpointing"), ("micro_batch_tokens", "microBatchTokens"), ("gpu_memory", "gpuMemory")):
        if getattr(args, flag) is not None:
            learner[key] = getattr(args, flag)
    for flag, value, low in (("--T", args.context_length, 1), ("--prompt-tokens", args.prompt_tokens, 1), ("--gpus", args.gpus, 0),
                             ("--nodes", args.nodes, 1), ("--micro-batch-tokens", args.micro_batch_tokens, 64)):
        if value is not None and value < low:
            return usage(f"{flag} {value}: must be at least {low}")
    try:
        model = memory.ModelShape.from_path(args.model)
        sequence = (args.context_length or 16384) + (args.prompt_tokens or memory.DEFAULT_PROMPT_TOKENS)
        shape = memory.shape_from_values(values, sequence_tokens=sequence, reference=args.reference)
        result = memory.plan(model, shape)
    except ValueError as exc:  # ModelShapeError, a bad size or precision in the values
        return usage(str(exc))
    if args.json:
        print(json.dumps({"fits": result.fits, "per_rank": result.per_rank, "rank_total": result.rank_total, "per_host": result.per_host,
                          "host_total": result.host_total, "problems": result.problems, "params": model.params}, indent=1))
    else:
        print(result.table(), end="")
    return Exit.ok if result.fits else Exit.failed


def serve_service(name: str) -> int:
    """Run one service; only its own (heavy) dependencies are imported."""
    if name == "controller":
        from magic.controller.app import run  # fastapi
    elif name == "rollout":
        from magic.rollout.worker import run  # torch
    elif name == "reward":
        from magic.reward.worker import run  # sympy
    elif name == "codejudge":
        from magic.codejudge.service import run  # the sandbox
    else:
        from magic.learner.worker import run  # torch
    return run()


# -- held-out evaluation -------------------------------------------------------------------------

EVAL_MAX_TOKENS = 4096
"""`magic eval`'s default T when the model's window allows it."""


def _eval_usage(problem: str) -> int:
    print(f"magic eval: {problem}", file=sys.stderr)
    return Exit.usage


_EVAL_FLAGS = {"samples": "--samples", "pass_k": "--pass-k", "temperature": "--temperature", "top_p": "--top-p",
               "context_length": "--T", "max_prompts": "--max-prompts"}


def _eval_settings_problem(args: argparse.Namespace) -> str | None:
    """The sampling flags checked by the schema the API checks an eval with (`EvalConfig`): the
    first problem, named by its flag, or None."""
    given = {"samples": args.samples, "pass_k": args.pass_k, "temperature": args.temperature, "top_p": args.top_p,
             "context_length": args.max_tokens, "max_prompts": args.max_prompts}
    try:
        EvalConfig.model_validate({"datasets": ["flags"], **{k: v for k, v in given.items() if v is not None}})
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        msg = err["msg"].removeprefix("Value error, ")
        if field not in given:  # a rule between fields (pass@k's k <= n): its message names them
            return f"{msg} (--pass-k, --samples)" if "pass_k" in msg else msg
        return f"{_EVAL_FLAGS[field]}: {msg}, got {given[field]}"
    return None


def output_problem(path: str) -> str | None:
    """Why the file `path` cannot be written, or None: checked before any work, so that results
    are never computed for a path that cannot take them."""
    p = Path(path)
    if p.is_dir():
        return f"--out {path} is a directory: name the JSON file to write"
    parent = p.resolve().parent
    if not parent.is_dir():
        return f"--out {path}: its directory {parent} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        return f"--out {path}: not writable"
    return None


def write_results(path: str, doc: dict) -> int:
    """Write `doc` as JSON to `path`; if that fails after all (the disk filled, the directory went
    away), to a file in the temporary directory, saying where: results are never lost."""
    text = json.dumps(doc, indent=1)
    try:
        Path(path).write_text(text)
    except OSError as exc:
        fd, rescue = tempfile.mkstemp(prefix="magic-eval-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        print(f"magic eval: cannot write {path} ({exc.strerror}); the results are in {rescue}", file=sys.stderr)
        return Exit.failed
    print(f"written: {path}")
    return Exit.ok


def eval_command(args: argparse.Namespace) -> int:
    """`magic eval`: check the flags (exit 2 with the reason), evaluate, print the table, write the JSON."""
    if (problem := _eval_settings_problem(args)) is not None:
        return _eval_usage(problem)
    if args.out and (problem := output_problem(args.out)) is not None:
        return _eval_usage(problem)
    if args.local and args.run:
        return _eval_usage("give either --run RUN (through the services) or --local MODEL_OR_CHECKPOINT (on this machine), not both")
    if args.local:
        if args.target is None:
            return _eval_usage("--local needs a model directory or a learner checkpoint to evaluate")
        if not args.dataset or len(args.dataset) != 1:
            return _eval_usage("--local evaluates one dataset file: give exactly one -d DATA.jsonl")
        return _eval_local(args)
    if args.run is None:
        return _eval_usage(
            "give --run RUN to evaluate a run's current policy through the services, or --local MODEL_OR_CHECKPOINT to evaluate "
            "on this machine; a checkpoint is evaluated with --local, or through the services by a run with no stages whose "
            "model is the checkpoint's `magic export` (docs/controller.md)"
        )
    if args.target is not None:
        return _eval_usage(f"--run evaluates the run's current policy: {args.target!r} is a target for --local only")
    if args.seed is not None:
        return _eval_usage("--seed is for --local: an eval of a run samples with the run's seeds (those of its validation)")
    if args.eval_id is not None and args.dataset:
        return _eval_usage(f"--id follows eval {args.eval_id} as it was posted: leave out -d and the sampling flags")
    if args.eval_id is None and not args.dataset:
        return _eval_usage("--run needs at least one registered dataset: -d NAME (magic dataset list)")
    if args.out and not args.wait:
        return _eval_usage("--out writes the figures once the eval is done: add --wait")
    if args.interval <= 0:
        return _eval_usage(f"--interval must be positive, got {args.interval}")
    return _eval_run(args)


def _eval_run(args: argparse.Namespace) -> int:
    """`magic eval --run`: post the eval (or follow --id), poll while --wait, print and write the figures."""
    body: dict = {"datasets": args.dataset, "samples": args.samples, "temperature": args.temperature, "top_p": args.top_p}
    for key, value in (("pass_k", args.pass_k), ("context_length", args.max_tokens), ("max_prompts", args.max_prompts)):
        if value is not None:
            body[key] = value
    try:
        with ControllerClient(args.url, args.token) as client:
            record = client.eval(args.run, args.eval_id) if args.eval_id else client.create_eval(args.run, body)
            if not args.wait:
                print(f"eval {record['id']} of run {args.run}: {record['status']} (follow it: magic eval --run {args.run} --id {record['id']} --wait)")
                return Exit.ok
            while record["status"] in ("pending", "running"):
                time.sleep(args.interval)
                record = client.eval(args.run, record["id"])
    except ClientError as exc:
        print(f"magic eval: {exc}", file=sys.stderr)
        return exit_for_status(exc.status)
    except KeyboardInterrupt:
        return Exit.interrupted
    if record["status"] != "done":
        print(f"magic eval: eval {record['id']} of run {args.run} failed: {record.get('error')}", file=sys.stderr)
        return Exit.failed
    print(f"run {args.run}, policy version {record['policy_version']}, T={record['context_length']} (eval {record['id']}):")
    print(render_figures(record["figures"]))
    if args.out:
        return write_results(args.out, {"mode": "run", "run": args.run, **record})
    return Exit.ok


def _eval_local(args: argparse.Namespace) -> int:
    # the dataset readers (pyarrow for Parquet) and the engine (torch): after the flags are checked
    from magic.controller.datasets import DatasetError, load_records
    from magic.local import evaluate as ev

    try:
        records = load_records(args.dataset[0])
    except DatasetError as exc:
        return _eval_usage(f"--dataset: {exc}")
    records = records[: args.max_prompts] if args.max_prompts else records
    if not records:
        return _eval_usage(f"--dataset {args.dataset[0]}: no records")
    if (blank := ev.without_ground_truth(records)) is not None:
        return _eval_usage(f"--dataset {args.dataset[0]}: record {blank} has no ground truth (reward_model.ground_truth is empty): it cannot be judged")
    try:
        engine = ev.load_engine(args.target)
    except ev.EvaluationError as exc:
        return _eval_usage(str(exc))
    window = ev.context_window(args.target)
    longest = max(len(engine.render_prompt([{"role": r, "content": c} for r, c in rec.messages])) for rec in records)
    t = args.max_tokens if args.max_tokens is not None else min(EVAL_MAX_TOKENS, (window or EVAL_MAX_TOKENS + longest) - longest)
    if t < 1 or (window is not None and longest + t > window):
        return _eval_usage(f"T = {t} plus the longest prompt ({longest} tokens) exceeds the model's context window {window}")
    seed = ev.DEFAULT_SEED if args.seed is None else args.seed
    name = Path(args.dataset[0]).stem
    t0 = time.monotonic()
    outcomes = ev.outcomes(engine, records, args.samples, args.temperature, t, seed, top_p=args.top_p)
    figures = {name: ev.summarise(outcomes, args.pass_k).as_dict()}
    report = {
        "target": str(Path(args.target).resolve()),
        "mode": "local",
        "dataset": str(Path(args.dataset[0]).resolve()),
        "samples": args.samples,
        "k": args.pass_k or args.samples,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "max_tokens": t,
        "seed": seed,
        "seconds": time.monotonic() - t0,
        "figures": figures,
        "prompts": [{"uid": rec.uid, "correct": o.correct, "lengths": o.lengths, "truncated": o.truncated, "answers": o.answers} for rec, o in zip(records, outcomes)],
    }
    print(render_figures(figures))
    if args.out:
        return write_results(args.out, report)
    return Exit.ok


def export_command(args: argparse.Namespace) -> int:
    """`magic export`: exit 2 naming the available steps for an unknown run, step or checkpoint."""
    # the shared volume's settings and the exporter (safetensors.torch, torch): only this command needs them
    from magic.config.settings import ServiceSettings
    from magic.learner.export import ExportError, export_checkpoint, find_checkpoint

    data_dir = args.data_dir or ServiceSettings().data_dir
    try:
        checkpoint = find_checkpoint(data_dir, args.run, args.step)
        files = export_checkpoint(checkpoint, Path(args.out), args.dtype, overwrite=args.force)
    except ExportError as exc:
        print(f"magic export: {exc}", file=sys.stderr)
        return Exit.usage
    print(f"exported {checkpoint} -> {args.out}: {', '.join(files)}")
    return Exit.ok


# -- the API commands ---------------------------------------------------------------------------


def api_command(args: argparse.Namespace) -> int:
    try:
        with ControllerClient(args.url, args.token) as client:
            return _dispatch(client, args)
    except ClientError as exc:
        print(f"magic: {exc}", file=sys.stderr)
        return exit_for_status(exc.status)
    except (OSError, ValueError) as exc:  # unreadable or malformed spec file or flag value
        print(f"magic: {exc}", file=sys.stderr)
        return Exit.usage
    except KeyboardInterrupt:
        return Exit.interrupted


def _dispatch(client, args: argparse.Namespace) -> int:
    cmd, action = args.command, getattr(args, "action", None)
    if cmd == "dataset" and action == "register":
        info = client.register_dataset(args.name, args.path, args.format, args.replace)
        print(f"dataset {info['name']}: {info['records']} records ({info['format']}), data sources {info['data_sources']}")
    elif cmd == "dataset":
        for d in client.datasets():
            print(f"{d['name']:24s} {d['records']:8d} records  {d['path']}")
    elif cmd == "run" and action == "create":
        view = client.create_run(load_file(args.file))
        print(f"run {view['name']} created: {len(view['spec']['stages'])} stages, up to {view['total_steps']} steps; status {view['status']}")
    elif cmd == "run" and action == "list":
        for r in client.runs():
            print(f"{r['name']:24s} {r['status']:10s} step {r['step']}")
    elif cmd == "run" and action == "get":
        print(json.dumps(client.run(args.run), indent=1))
    elif cmd == "run":
        view = client.action(args.run, action)
        print(f"run {view['name']}: {view['status']}" + (f" (requested: {', '.join(view['requested'])})" if view["requested"] else ""))
    elif cmd == "stage":
        stage = load_file(args.file) if args.file else {}
        if not isinstance(stage, dict):
            raise ValueError(f"{args.file}: a stage file holds one JSON/YAML object (StageConfig)")
        stage = merge(StageConfig, stage, model_overrides(args, StageConfig, "stage"))
        if args.plateau:
            stage["plateau"] = parse_plateau(args.plateau)
        view = client.start_stage(args.run, stage)
        added = view["spec"]["stages"][-1]
        print(f"run {view['name']}: stage {added['name']!r} appended (T={added['context_length']}, D_R={added['rollout_batch_size']}, gs={added['group_size']}); status {view['status']}")
    elif cmd == "plan":
        doc = load_file(args.file)
        if not isinstance(doc, (list, dict)):
            raise ValueError(f"{args.file}: a plan file holds a list of stages or {{\"stages\": [...], \"on_plan_end\": ...}}")
        stages, end = (doc, None) if isinstance(doc, list) else (doc.get("stages", []), doc.get("on_plan_end"))
        view = client.submit_plan(args.run, stages, end)
        print(f"run {view['name']}: plan of {len(view['spec']['stages'])} stages; status {view['status']}")
    elif cmd == "status":
        return _status(client, args)
    return 0


def parse_plateau(text: str) -> dict:
    """`METRIC[:WINDOW[:MIN_DELTA]]` as a PlateauRule dict; empty parts keep PlateauRule's defaults.

    >>> parse_plateau("reward_mean:5")
    {'metric': 'reward_mean', 'window': 5}
    >>> parse_plateau("::0.02")
    {'min_delta': 0.02}
    """
    parts = text.split(":")
    if len(parts) > 3:
        raise ValueError(f"--plateau {text!r}: expected METRIC[:WINDOW[:MIN_DELTA]]")
    rule: dict = {}
    for key, kind, part in zip(("metric", "window", "min_delta"), (str, int, float), parts):
        if part:
            try:
                rule[key] = kind(part)
            except ValueError:
                raise ValueError(f"--plateau {text!r}: {key} must be {kind.__name__}, got {part!r}") from None
    return rule


def render_status(view: dict) -> str:
    """A run's status as a few lines of text."""
    lines = [f"run {view['name']}: {view['status']}  (phase {view['phase']}, step {view['step']}/{view['total_steps']}, policy version {view.get('policy_version')})"]
    if view.get("stage_name"):
        lines.append(f"stage {view['stage']} '{view['stage_name']}'  T={view['context_length']}")
    if view.get("error"):
        lines.append(f"error: {view['error']}")
    workers = ", ".join(f"{svc} {len(ws)}" for svc, ws in view["workers"].items())
    lines.append(f"live workers: {workers}")
    tp = view.get("throughput") or {}
    if tp.get("steps_per_hour"):
        lines.append(f"throughput: {tp['steps_per_hour']:.1f} steps/h, {tp['samples_per_second']:.2f} samples/s, {tp['response_tokens_per_second']:.1f} response tokens/s")
    f = view.get("filtering") or {}
    if any(f.get(k) for k in ("dropped_online", "dropped_estimated_0", "dropped_estimated_all")):
        lines.append(f"filtered prompts: online {f['dropped_online']}, estimated 0/N {f['dropped_estimated_0']}, N/N {f['dropped_estimated_all']}")
    for s in view.get("stages", []):
        end = f"ended at step {s['end_step']} ({s['end_reason']})" if s.get("end_step") is not None else "running"
        lines.append(f"  stage {s['index']} '{s['name']}' T={s['context_length']}: from step {s['start_step']}, {s['prompts']} prompts, {s['dropped_online']} dropped online; {end}")
    if view.get("optimizer_resets"):
        lines.append(
            f"optimizer state reset {view['optimizer_resets']} time(s), last at step {view['last_optimizer_reset_step']} "
            "(the learner resumed without a checkpoint of the policy it resumed: AdamW's moments started afresh)"
        )
    last = view.get("last_metrics")
    if last:
        figures = ("reward_mean", "accuracy_all", "entropy", "response_clip_ratio", "response_length_mean", "step_seconds_total")
        lines.append("last step " + str(last["step"]) + ": " + "  ".join(f"{k} {last[k]:.3f}" for k in figures if isinstance(last.get(k), (int, float))))
    val = view.get("validation")
    if val:
        lines.append(f"held-out (policy version {val['policy_version']}):")
        lines += [f"  {line}" for line in render_figures(val["datasets"]).splitlines()]
    return "\n".join(lines)


def render_figures(figures: dict[str, dict]) -> str:
    """Held-out figures per dataset (`magic.evaluation.Figures` as dicts) as a table."""
    def ci(f: dict, name: str) -> str:
        low, high = f.get(f"{name}_ci_low"), f.get(f"{name}_ci_high")
        return "" if low is None or high is None else f"[{low:.3f}, {high:.3f}]"

    rows = [f"{'dataset':20s} {'prompts':>7s} {'avg@n':>12s} {'95% CI':>15s} {'pass@k':>12s} {'95% CI':>15s} {'maj@n':>12s} {'length':>8s} {'truncated':>9s}"]
    for name, f in figures.items():
        rows.append(
            f"{name:20s} {f['prompts']:7d} {'avg@' + str(f['samples']) + ' ' + format(f['avg_at_n'], '.3f'):>12s} {ci(f, 'avg_at_n'):>15s} "
            f"{'pass@' + str(f['k']) + ' ' + format(f['pass_at_k'], '.3f'):>12s} {ci(f, 'pass_at_k'):>15s} "
            f"{'' if f.get('maj_at_n') is None else 'maj@' + str(f['samples']) + ' ' + format(f['maj_at_n'], '.3f'):>12s} "
            f"{f['response_length_mean']:8.1f} {f['truncated_ratio']:9.3f}"
        )
    return "\n".join(rows)


def _status(client, args: argparse.Namespace) -> int:
    tty = sys.stdout.isatty()
    while True:
        view = client.run(args.run)
        if args.json:
            print(json.dumps(view, indent=1), flush=True)
        else:
            if args.watch and tty:
                print("\033[H\033[J", end="")
            print(render_status(view), flush=True)
        if not args.watch or RunStatus(view["status"]) in TERMINAL:
            return Exit.failed if view["status"] == RunStatus.failed else Exit.ok
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
