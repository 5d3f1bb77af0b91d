"""`magic local`: the whole MAGIC loop on one machine, on CPU, with the tiny demo model.

What it runs: the four services as separate processes over a private Redis, a two-stage plan
(stage 1 with a short context length T that truncates the longest solutions, stage 2 with a
longer one), on-policy GRPO with token-level clipped loss, clip-higher and adaptive entropy
control, tau = 1. It evaluates held-out accuracy (avg@k at tau) before and after, and writes
per-step metrics (JSONL) and a plot.

How it departs from the paper: a 0.8M-parameter model and a synthetic arithmetic task instead of
a distilled 7B-32B model on math/code; short stages (tens of steps) instead of hundreds.

    magic local                      # defaults: 16 + 24 steps, T = 72 then 96
    magic local --steps 120          # a longer run; --stages plan.json for your own plan
    magic local --help               # the knobs (steps, stages, engine, output dir) first

If any service dies, everything is stopped and the command exits non-zero with that service's
log tail.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from magic.config.flags import describe_errors
from magic.config.schema import StageConfig
from magic.controller.client import ClientError, ControllerClient
from magic.controller.datasets import load_jsonl
from magic.local.options import stage_plan
from magic.local.redis_server import RedisServer
from magic.local.supervisor import Supervisor
from magic.protocol.layout import CHECKPOINT_MANIFEST, checkpoint_root
from magic.protocol.status import TERMINAL, RunStatus
from magic.rollout.settings import RolloutSettings
from magic.rollout.vllm_server import default_python
from magic.runtime.exits import Exit
from magic.runtime.ports import free_port
from magic.store import acl
from magic.store.runs import final_validation_record

log = logging.getLogger("magic.local")


class LaunchError(RuntimeError):
    pass


def _line(r: dict) -> str:
    entropy = r.get("entropy")
    return (
        f"step {r['step']:3d} [{r['stage_name']} T={r['context_length']}] "
        f"reward {r['reward_mean']:.3f}  acc {r['accuracy_all']:.3f}  entropy {'-' if entropy is None else f'{entropy:.3f}'}  "
        f"truncated {r['response_clip_ratio']:.2f}  len {r['response_length_mean']:.1f}  "
        f"step {r['step_seconds_total']:.1f}s (rollout {r['step_seconds_rollout']:.1f}s, train {r['step_seconds_train']:.1f}s)"
        + (f"  stale {r['samples_stale']:.0f}" if r.get("samples_stale") else "")  # max_staleness: samples of the previous version(s)
    )


def _streams(value: str) -> bool:
    """MAGIC_STREAM as the learner's settings read it (pydantic's bool); a value it refuses: False
    here, and the learner says why it cannot start."""
    try:
        return TypeAdapter(bool).validate_python(value)
    except ValidationError:
        return False


DATASET = "chain-sum"
HELDOUT = "chain-sum-heldout"
DUMP_PROMPTS = 4
"""Every validation writes the samples of its first this many prompts (data/runs/<run>/generations/)."""


def build_spec(args: argparse.Namespace, demo, stages: list) -> dict:
    """The run: the demo model and data, and `stages` (validated StageConfigs); with in-run
    validation, the first --val-prompts held-out prompts every --val-every steps (at most the
    plan's length), avg@--eval-samples at the first stage's tau and each stage's T. Validation
    leaves training as it is: its groups have their own seeds and run between steps, and the
    engine samples every group from its own generator."""
    spec = {
        "name": args.run_name,
        "model": str(demo.model.resolve()),
        "datasets": [DATASET],
        "seed": args.seed,
        "stages": [s.model_dump(mode="json") for s in stages],
    }
    if args.val_every > 0 and not args.no_eval:
        spec["validation"] = {
            "datasets": [HELDOUT], "every": min(args.val_every, sum(s.steps for s in stages)), "samples": args.eval_samples,
            "temperature": stages[0].temperature, "max_prompts": args.val_prompts,
            "dump_prompts": min(DUMP_PROMPTS, args.val_prompts), "best_by": "avg_at_n",  # generations to read; the best checkpoint kept
        }
    return spec


def engine_env(engine: str) -> dict[str, str]:
    """Rollout settings for `--engine`: with vllm, each rollout process starts its own vLLM server."""
    if engine == "vllm":
        return {"MAGIC_ENGINE": "vllm", "MAGIC_VLLM_LAUNCH": "true"}
    return {"MAGIC_ENGINE": "torch"}


def transport_env(transport: str) -> dict[str, str]:
    """Learner and rollout settings for `--transport` (the same value for both, as they must agree)."""
    if transport == "http":
        port = free_port()
        config = {"type": "http", "host": "127.0.0.1", "port": port, "advertise_url": f"http://127.0.0.1:{port}"}
    else:
        config = {"type": "filesystem"}
    return {"MAGIC_WEIGHT_TRANSPORT": json.dumps(config)}


def ensure_vllm_venv() -> None:
    """Create the vLLM virtualenv with `make vllm-venv` on first use (a few minutes, once)."""
    if RolloutSettings().vllm_python is not None:  # MAGIC_VLLM_PYTHON
        return  # the rollout service checks it when it starts the server
    python = default_python()
    if python.exists() and (python.parents[1] / ".installed").exists():
        return
    repo = python.parents[2]
    if not (repo / "Makefile").exists():
        raise LaunchError(f"no vLLM virtualenv at {python.parents[1]} and no Makefile at {repo} to create it: set MAGIC_VLLM_PYTHON")
    print(f"[0/5] creating the vLLM virtualenv {python.parents[1]} (`make vllm-venv`, once: about 2-5 minutes) ...", flush=True)
    if subprocess.run(["make", "-C", str(repo), "vllm-venv"]).returncode != 0:
        raise LaunchError("`make vllm-venv` failed; see its output above")


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds like Ctrl-C: the services and Redis are stopped


def launch(args: argparse.Namespace) -> int:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:  # before the warm start: a typo in a flag or plan file costs nothing
        stages = [StageConfig(**s) for s in stage_plan(args)]
    except ValidationError as exc:  # a stage flag or a field of the --stages file, named as the user wrote it
        print(f"magic local: invalid stage plan:\n{describe_errors(exc, StageConfig)}", file=sys.stderr)
        return Exit.usage
    except (OSError, ValueError) as exc:
        print(f"magic local: invalid stage plan: {exc}", file=sys.stderr)
        return Exit.usage
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "matplotlib", "transformers", "filelock"):  # a library's chatter is not the run's
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from magic.demo.prepare import prepare  # heavy (torch, transformers): after the plan is checked
    from magic.demo.sft import SFTConfig  # heavy (torch)

    t_start = time.time()
    if args.engine == "vllm":
        try:
            ensure_vllm_venv()
        except LaunchError as exc:
            print(f"\nmagic local failed: {exc}", file=sys.stderr, flush=True)
            return Exit.failed
    print("[1/5] preparing the tiny model and data (cached after the first run) ...", flush=True)
    # progress bars only on a terminal: in a log file they leave \r fragments (one plain line a step instead)
    demo = prepare(args.demo_dir, sft=SFTConfig(steps=args.sft_steps) if args.sft_steps else None, progress=sys.stdout.isatty())
    out = Path(args.out).resolve()
    try:
        return _run(args, demo, stages, out, t_start)
    except (LaunchError, ClientError) as exc:
        print(f"\nmagic local failed: {exc}", file=sys.stderr, flush=True)
        return Exit.failed


def _run(args: argparse.Namespace, demo, stages: list, out: Path, t_start: float) -> int:
    import torch  # heavy: after the plan is checked

    if out.exists():
        shutil.rmtree(out)
    (out / "data").mkdir(parents=True)
    torch.set_num_threads(2)
    print("[2/5] starting a private redis-server and the services ...", flush=True)
    redis_server = RedisServer().start()
    # each service reaches Redis as its own ACL user, allowed only its role's writes
    urls = acl.create_users_at(redis_server.url, {role: secrets.token_urlsafe(24) for role in acl.ROLES})
    api_port = free_port()
    base_env = {"MAGIC_DATA_DIR": str(out / "data"), "MAGIC_LOG_LEVEL": "INFO"}
    base_env |= transport_env(args.transport)
    # generation and training run in turn (the recipe's barrier): each uses both cores; where they
    # overlap (streaming, bounded staleness), four torch threads on two cores made a step 2-9x
    # slower (docs/benchmarks.md), so each gets one core
    stream = os.environ.get("MAGIC_STREAM", "false")
    overlap = _streams(stream) or any(s.max_staleness for s in stages)
    threads = "1" if overlap else "2"
    rollout_env = {"MAGIC_TORCH_THREADS": threads} | engine_env(args.engine)
    sup = Supervisor(out / "logs", base_env)
    token = secrets.token_urlsafe(24)  # the API is on loopback, but mutating calls still need it
    judge_port, judge_token = free_port(), secrets.token_urlsafe(24)  # the code judge's own token
    try:
        # the code judge: the only process that runs programs (the demo's prompts are math; a code
        # dataset's answers go there). Where its sandbox cannot start (bubblewrap, root), it says so
        # in its log and code answers are judged error; math is unaffected.
        sup.start("codejudge", "magic.codejudge", {"MAGIC_JUDGE_PORT": str(judge_port), "MAGIC_API_TOKEN": judge_token})
        sup.start("controller", "magic.controller", {"MAGIC_REDIS_URL": urls["controller"], "MAGIC_PORT": str(api_port), "MAGIC_API_TOKEN": token})
        # the learner trains each step's batch once it is whole (MAGIC_STREAM=false): streamed beside the
        # rollout's generation on the same two cores it only slows the step (docs/benchmarks.md);
        # MAGIC_STREAM=true in the environment streams all the same (to compare)
        sup.start("learner", "magic.learner", {"MAGIC_REDIS_URL": urls["learner"], "MAGIC_TORCH_THREADS": threads, "MAGIC_STREAM": stream})
        for i in range(args.rollout_workers):
            sup.start(f"rollout-{i}", "magic.rollout", {"MAGIC_REDIS_URL": urls["rollout"], **rollout_env})
        for i in range(args.reward_workers):
            sup.start(f"reward-{i}", "magic.reward", {"MAGIC_REDIS_URL": urls["reward"], "MAGIC_TORCH_THREADS": "1",
                                                       "MAGIC_CODE_JUDGE__URL": f"http://127.0.0.1:{judge_port}", "MAGIC_CODE_JUDGE__API_TOKEN": judge_token})
        api = ControllerClient(f"http://127.0.0.1:{api_port}", token, timeout=30)
        _wait_ready(api, sup)

        spec = build_spec(args, demo, stages)
        eval_kwargs = dict(samples_per_prompt=args.eval_samples, temperature=stages[0].temperature, max_tokens=max(s.context_length for s in stages))
        before = None
        if not args.no_eval:
            print(f"[3/5] held-out accuracy of the warm start (avg@{args.eval_samples}, tau={stages[0].temperature}) ...", flush=True)
            before = _evaluate(demo, None, args.eval_prompts, eval_kwargs)
            print(f"      before RL: accuracy {before.avg_at_n:.1%}  (pass@{before.k} {before.pass_at_k:.1%}, truncated {before.truncated_ratio:.1%}, length {before.response_length_mean:.1f})", flush=True)

        try:
            api.register_dataset(DATASET, str(demo.train.resolve()))
            if "validation" in spec:
                api.register_dataset(HELDOUT, str(demo.eval.resolve()))
            total = api.create_run(spec)["total_steps"]
        except ClientError as exc:
            raise LaunchError(f"the controller refused the run: {exc}") from None
        print(f"[4/5] training: {total} on-policy steps over {len(spec['stages'])} stages", flush=True)
        token_file = out / "api-token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        print(f"      watch it from another shell: MAGIC_API_TOKEN=$(cat {token_file}) magic status {args.run_name} --url http://127.0.0.1:{api_port} --watch", flush=True)
        records = _follow(api, sup, args.run_name, total, args.timeout)
        validations = {int(v): f[HELDOUT] for v, f in api.get(f"/v1/runs/{args.run_name}/validation").items()} if "validation" in spec else {}
        best = api.run(args.run_name).get("best")  # the best validation and its checkpoint (validation.best_by)

        after = None
        weights_dir = out / "data" / "runs" / args.run_name / "weights"
        if not args.no_eval:
            print("[5/5] held-out accuracy of the trained policy ...", flush=True)
            after = _evaluate(demo, weights_dir, args.eval_prompts, eval_kwargs)
            print(f"      after RL:  accuracy {after.avg_at_n:.1%}  (pass@{after.k} {after.pass_at_k:.1%}, truncated {after.truncated_ratio:.1%}, length {after.response_length_mean:.1f})", flush=True)
    finally:
        sup.stop_all()
        redis_server.stop()

    from magic.local.plot import plot_run  # heavy (matplotlib): only once the run is over

    metrics_path = out / "metrics.jsonl"
    final = [final_validation_record(len(records), {HELDOUT: validations[len(records)]})] if len(records) in validations else []
    metrics_path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records + final))  # the final policy's validation last, as the controller's
    plot = plot_run(records, out / "run.png", before.as_dict() if before else None, after.as_dict() if after else None, validations)
    mismatches = int(sum(r.get("version_mismatch", 0) for r in records))  # outside the step's version window: never trained
    stale = int(sum(r.get("samples_stale", 0) for r in records))  # of an older version within max_staleness: trained, decoupled
    summary = {
        "steps": len(records),
        "stages": sorted({r["stage_name"] for r in records}),
        "heldout_accuracy_before": before.avg_at_n if before else None,
        "heldout_accuracy_after": after.avg_at_n if after else None,
        "heldout_before": before.as_dict() if before else None,  # every figure (magic.evaluation.Figures)
        "heldout_after": after.as_dict() if after else None,
        "validation": {str(v): f for v, f in sorted(validations.items())},  # in-run: policy version -> figures
        "best": best,
        "version_mismatches": mismatches,
        "samples_stale": stale,
        "engine": args.engine,
        "transport": args.transport,
        "wall_seconds": time.time() - t_start,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print("\n=== MAGIC local run ===")
    print(f"steps: {len(records)} over stages {', '.join(summary['stages'])}; samples dropped for their policy version: {mismatches}"
          + (f"; samples trained from the previous version(s) (max_staleness): {stale}" if stale else ""))
    if before and after:
        print(f"held-out accuracy: {before.avg_at_n:.1%} -> {after.avg_at_n:.1%} ({100 * (after.avg_at_n - before.avg_at_n):+.1f} points)")
    print(f"metrics: {metrics_path}\nplot:    {plot}\nlogs:    {out / 'logs'}\nwall time: {summary['wall_seconds']:.0f}s")
    print("\n" + next_commands(out, plot, summary["steps"], args.run_name))
    return 0


def magic_command() -> str:
    """How to run `magic` again from this shell: `magic` when it is on the PATH, else the path this
    process was started by (`.venv/bin/magic` after `make run`), relative to the working directory."""
    argv0 = Path(sys.argv[0])
    if argv0.name != "magic" or shutil.which("magic") == str(argv0.resolve()):
        return "magic"
    try:
        return str(argv0.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(argv0.resolve())


def next_commands(out: Path, plot: Path, steps: int, run: str = "local") -> str:
    """The commands a user tries next: the run's status, the plot, a longer plan, the newest
    checkpoint as a model directory (when one was written) — each runnable as printed."""
    magic = magic_command()
    return "\n".join([
        "next:",
        f"  cat {out / 'summary.json'}    # the run's status at its end (while a run goes: the `magic status` line printed at [4/5])",
        f"  xdg-open {plot}    # the curves: accuracy (rollout and held-out), entropy, response length and truncation per step (open on macOS)",
        f"  {magic} local --steps {max(3 * steps, 120)}    # a longer plan; --stages plan.json for your own stages ({magic} local --help)",
        *([f"  {magic} export {run} --data-dir {out / 'data'} --out {out.parent / (out.name + '-model')}    # the newest checkpoint as a model directory (outside --out, which the next run empties)"]
          if any(checkpoint_root(out / "data" / "runs" / run).glob(f"step-*/{CHECKPOINT_MANIFEST}")) else []),
        *([f"  head -n 2 {newest}    # what the model wrote at the last validation (prompt, response, answer, verdict)"]
          if (newest := max((out / "data" / "runs" / run / "generations").glob("step-*.jsonl"), default=None)) else []),
    ])


def _wait_ready(api, sup, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _check_services(sup)
        if api.ready():
            return
        time.sleep(0.2)
    raise LaunchError("the controller did not become ready within 120s; see logs/controller.log")


def _check_services(sup) -> None:
    dead = sup.first_exit()
    if dead is not None:
        raise LaunchError(f"service {dead.name} exited with code {dead.proc.returncode}; last lines of {dead.log_path}:\n{dead.log_tail()}")


def _follow(api, sup, run: str, total: int, timeout: float) -> list[dict]:
    """Show progress until the run ends; return its step records."""
    from tqdm import tqdm

    records: list[dict] = []
    deadline = time.monotonic() + timeout
    with tqdm(total=total, unit="step", dynamic_ncols=True, file=sys.stdout, disable=not sys.stdout.isatty()) as bar:
        while True:
            _check_services(sup)
            new = api.metrics(run, since=len(records))
            for r in new:
                records.append(r)
                bar.write(_line(r))
                bar.update(1)
            status = api.run(run)
            if status["status"] == RunStatus.failed:
                raise LaunchError(f"run failed: {status.get('error')}")
            if RunStatus(status["status"]) in TERMINAL and len(records) >= status["step"]:
                return records
            if time.monotonic() > deadline:
                raise LaunchError(f"the run did not finish within {timeout:.0f}s")
            time.sleep(0.3)


def _evaluate(demo, weights_dir: Path | None, n_prompts: int, kwargs: dict):
    """Held-out figures (`magic.evaluation.Figures`) of the warm start, or of the newest weights
    published under `weights_dir`: avg@n over the first `n_prompts` held-out prompts, prompt i
    seeded 1234 + i (the accuracy printed is avg@n)."""
    from magic.local.evaluate import evaluate, load_engine  # heavy (torch), as the one below
    from magic.weights import FilesystemWeightStore

    weights = None
    if weights_dir is not None:
        store = FilesystemWeightStore(weights_dir)
        versions = store.complete_versions()
        if not versions:
            raise LaunchError(f"no published weights under {weights_dir}")
        weights = store.load_version(versions[-1])
    return evaluate(load_engine(demo.model, weights), load_jsonl(demo.eval)[:n_prompts], **kwargs)
