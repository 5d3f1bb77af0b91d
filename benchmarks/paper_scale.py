"""Paper-scale simulation: one MAGIC run at the Skywork-OR1 shape with stand-in generation and training.

Real: a private Redis (maxmemory + noeviction, as the chart's), the controller (`magic serve
controller`, its REST API, step barrier and stream retention), the reward service(s) (`magic
serve reward`, the math verifier on every sample), the rollout worker's and the learner's service
loops (RolloutWorker: pulling, weight sync, publish + ack; LearnerWorker: the step ledger, acks,
weight publishing on the filesystem transport, StepCompleted).
Stand-ins: the rollout *engine* returns paper-shaped groups (D_R × gs samples, response lengths
drawn from a long-tailed log-normal, median 4k tokens, cut at T = 16k) with token ids, logprobs
and a reasoning text ending in a boxed answer (right half the time); each group is ready
`--generation-seconds` × (its longest response / T) after it was admitted, as if a vLLM fleet
generated it. The *trainer* sleeps `--train-seconds` and publishes a tiny state dict.

Per step it prints: the step's time and its orchestration share (everything that is neither
generation nor training: publishing, the reward tail, collection, weight sync, recording) and,
with s = 0, where the tail after the stand-in generation goes (the rollout worker's publishing,
the reward service, the learner's part, from the streams' last entry times),
Redis memory (at the step's end and its peak), stream lengths, bytes through Redis, and the
reward service's throughput. It exits non-zero if a step is missing, a group was lost, or
anything was dead-lettered.

    .venv/bin/python benchmarks/paper_scale.py                          # D_R=256, gs=16, T=16k, 4 steps
    .venv/bin/python benchmarks/paper_scale.py --groups 32 --steps 50   # memory over 50 steps
    .venv/bin/python benchmarks/paper_scale.py --rollout-workers 4      # several rollout processes
    .venv/bin/python benchmarks/paper_scale.py --validation-every 2     # + held-out validation (AIME24-sized: 30 x 32)

At the end it states the weight fan-out per transport (filesystem, http, nccl) for the rollout
workers it ran and for --fanout-pods (64): bytes through the shared volume, the learner's link
and each pod's link per step, from the weight loads per worker per step it measured.

With --validation-every E the run validates every E steps (and the final policy) on a held-out
set of --validation-prompts prompts x --validation-samples samples at the run's T, through the
same stand-in fleet and the real reward service; each step's validation wall time is printed
beside the step's (it runs between steps, so it adds to the run's wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STREAMS = ("prompts", "rollouts", "scored", "events", "weights", "dead")
RUN = "paper-scale"


# -- stand-ins (run inside the worker processes) ------------------------------------------------


def response_lengths(rng: random.Random, n: int, max_tokens: int, median: float = 4000.0, sigma: float = 0.8) -> list[int]:
    """n response lengths from a log-normal (median `median`), cut at `max_tokens` (truncated)."""
    import math

    return [max(16, min(max_tokens, int(math.exp(rng.gauss(math.log(median), sigma))))) for _ in range(n)]


class StandInEngine:
    """A RolloutEngine that generates nothing: paper-shaped samples, ready after the time a fleet would take."""

    def __init__(self, max_batch_sequences: int, generation_seconds: float, vocab: int, seed: int):
        from magic.protocol.pb import messages_pb2 as pb

        self.pb = pb
        self.version = -1
        self.max_batch_sequences = max_batch_sequences
        self.generation_seconds = generation_seconds
        self.rng = random.Random(seed)
        span = 40_000
        self.ids = [self.rng.randrange(vocab) for _ in range(span)]
        self.logps = [-self.rng.expovariate(2.0) for _ in range(span)]
        self.filler = ("We add the numbers one at a time and check each partial sum carefully. " * 2000)[: 4 * span]
        self.work: dict[str, tuple[float, list]] = {}
        self.busy = BusyClock(busy_file("rollout"))  # the fleet's utilisation: time with a group in flight

    def render_prompt(self, messages):
        return self.ids[:200]

    def submit(self, key, request):
        from magic.rollout.engine import GeneratedSample

        lengths = response_lengths(self.rng, request.n, request.max_tokens)
        samples = []
        for n in lengths:
            off = self.rng.randrange(len(self.ids) - n)
            truncated = n >= request.max_tokens
            boxed = "" if truncated else f"\n\nSo the answer is $\\boxed{{{'ANSWER' if self.rng.random() < 0.5 else 'WRONG'}}}$."
            samples.append(GeneratedSample(self.ids[off: off + n], self.logps[off: off + n],
                                           self.pb.FINISH_REASON_LENGTH if truncated else self.pb.FINISH_REASON_STOP,
                                           self.filler[: 4 * n] + boxed))
        ready = time.monotonic() + self.generation_seconds * max(lengths) / request.max_tokens
        self.work[key] = (ready, samples)
        self.busy.mark(True)

    def step(self):
        now = time.monotonic()
        done = [k for k, (t, _) in self.work.items() if t <= now]
        if not done:
            time.sleep(0.005)
        out = [(k, self.work.pop(k)[1]) for k in done]
        self.busy.mark(bool(self.work))
        return out

    def free_slots(self):
        return self.max_batch_sequences - sum(len(s) for _, s in self.work.values())

    def in_flight(self):
        return list(self.work)

    def abort(self, keys=None):
        gone = list(self.work) if keys is None else [k for k in keys if k in self.work]
        for k in gone:
            self.work.pop(k)
        return gone

    def load_checkpoint(self, checkpoint):
        self.version = checkpoint.version

    def pause(self):
        pass

    def resume(self):
        pass

    def healthy(self):
        return True

    def close(self):
        pass


def busy_file(role: str) -> Path | None:
    """Where a stand-in process writes its busy seconds (MAGIC_BENCH_BUSY_DIR, set by the driver)."""
    root = os.environ.get("MAGIC_BENCH_BUSY_DIR")
    return Path(root) / f"{role}-{os.environ.get('MAGIC_WORKER_NAME', role)}.busy" if root else None


class BusyClock:
    """Cumulative seconds a stand-in was busy, written to `path` at most every 0.2 s (the driver
    turns its increments into utilisation per step)."""

    def __init__(self, path: Path | None):
        self.path, self.seconds, self.last, self.written, self.busy = path, 0.0, time.monotonic(), 0.0, False

    def mark(self, busy: bool) -> None:
        """Count the time since the last mark as busy if it was busy then; `busy`: whether it is
        from now on (written at once when that changes, else at most every 0.2 s)."""
        now = time.monotonic()
        if self.busy:
            self.seconds += now - self.last
        changed, self.last, self.busy = busy != self.busy, now, busy
        if self.path is not None and (changed or now - self.written > 0.2):
            self.flush()

    def add(self, seconds: float) -> None:
        self.seconds += seconds
        self.last = time.monotonic()
        if self.path is not None:
            self.flush()

    def flush(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{self.seconds:.6f}")
        tmp.replace(self.path)
        self.written = time.monotonic()


def busy_seconds(root: Path, role: str) -> float:
    """The busy seconds of every stand-in of `role` so far (summed over workers)."""
    total = 0.0
    for f in root.glob(f"{role}-*.busy"):
        try:
            total += float(f.read_text() or 0)
        except (OSError, ValueError):
            pass
    return total


def seconds_per_token(train_seconds: float, groups: int, group_size: int, max_tokens: int) -> float:
    """The stand-in learner's pace: `train_seconds` for a batch of the expected size (D_R x gs
    responses of the long-tailed lengths), so its time grows with the tokens it is given."""
    mean = sum(response_lengths(random.Random(7), 20_000, max_tokens)) / 20_000
    return train_seconds / (groups * group_size * mean)


def _tokens(groups) -> int:
    return sum(len(s.response_ids) for g in groups for s in g.rollout.samples)


class StandInStreaming:
    """`magic.learner.streaming` for the stand-in trainer: each arriving group takes its tokens'
    share of the step's training time at once; the update at the end takes none."""

    class StreamingStep:
        def __init__(self, trainer, version, stage):
            self.trainer, self.version, self.stage, self.groups = trainer, version, stage, []

        def add(self, *groups):
            self.groups.extend(groups)
            self.trainer.sleep(_tokens(groups))

        def finish(self):
            return self.trainer.figures(self.groups, self.version, self.stage)

    @staticmethod
    def why_not(stage, backend):
        return None


class StandInTrainer:
    """The learner's trainer, minus the training: sleeps in proportion to the tokens it is given,
    reports what it was given."""

    def __init__(self, per_token: float):
        import torch

        from magic.learner.entropy import EntropyController

        self.per_token = per_token
        self.busy = BusyClock(busy_file("learner"))
        self.controller = EntropyController()
        state = {"w": torch.zeros(4)}

        class Backend:  # what the worker's publish asks of a backend: the layout, then the buckets
            def published_layout(self, dtype=None):
                return [(k, dtype or v.dtype, tuple(v.shape)) for k, v in state.items()]

            def state_dict_buckets(self, bucket_bytes, dtype=None):
                yield {k: v.to(dtype) if dtype else v for k, v in state.items()}

        self.backend = Backend()

    def sleep(self, tokens: int) -> None:
        seconds = self.per_token * tokens
        time.sleep(seconds)
        self.busy.add(seconds)

    def train_step(self, groups, version, stage):
        self.sleep(_tokens(groups))
        return self.figures(groups, version, stage)

    def figures(self, groups, version, stage):
        samples = [s for g in groups for s in g.scores]
        lags = [version - s.policy_version for g in groups for s in g.rollout.samples]
        mismatch = sum(1 for lag in lags if not 0 <= lag <= stage.max_staleness)
        return {
            "groups": float(len(groups)),
            "distinct_groups": float(len({g.rollout.prompt.group_id for g in groups})),
            "samples": float(len(samples)),
            "tokens_trained": float(sum(len(s.response_ids) for g in groups for s in g.rollout.samples)),
            "longest_response": float(max((len(s.response_ids) for g in groups for s in g.rollout.samples), default=0)),
            "reward_mean": sum(s.reward for s in samples) / max(1, len(samples)),
            "accuracy_all": sum(s.correctness for s in samples) / max(1, len(samples)),
            "version_mismatch": float(mismatch),
            "samples_stale": float(sum(1 for lag in lags if 0 < lag <= stage.max_staleness)),
        }

    def save_checkpoint(self, *args, **kwargs):
        return None

    def wait_for_checkpoint(self):
        pass


def serve_rollout(args) -> int:
    from magic.rollout.settings import RolloutSettings
    from magic.rollout.worker import SERVICE, RolloutWorker
    from magic.runtime.service import serve
    from magic.weights import make_receiver

    settings = RolloutSettings()
    seed = abs(hash(settings.worker_name)) % (1 << 30)

    def attach(channels):
        engine = StandInEngine(settings.max_batch_sequences, args.generation_seconds, args.vocab, seed)
        receiver = make_receiver(settings.weight_transport, worker_name=settings.worker_name, cache_dir=settings.data_dir / "cache")
        return RolloutWorker(channels, settings, engine, receiver)

    return serve(SERVICE, settings, attach)


def serve_learner(args) -> int:
    import magic.learner.worker as lw
    from magic.learner.settings import LearnerSettings
    from magic.runtime.service import serve

    settings = LearnerSettings()
    per_token = seconds_per_token(args.train_seconds, args.groups, args.group_size, args.max_tokens)
    lw._attach = lambda *a, **k: StandInTrainer(per_token)  # the stand-in trainer
    lw.streaming = StandInStreaming  # MAGIC_STREAM decides: each group trains as it arrives, or the whole batch at the end
    return serve(lw.SERVICE, settings, lambda channels: lw.LearnerWorker(channels, settings))


# -- the driver (this process) ------------------------------------------------------------------


def _dataset(path: Path, n: int) -> None:
    """n math prompts whose ground truth is the literal ANSWER (the stand-in boxes ANSWER or WRONG)."""
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"Problem {i}: what is the answer? Put it in \\boxed{{}}."}],
                                "data_source": "math", "reward_model": {"ground_truth": "ANSWER"}, "extra_info": {"index": i}}) + "\n")


def _redis_figures(r, k) -> dict:
    from magic.store.channels import stream_keys

    mem = r.info("memory")
    stats = r.info("stats")
    pipe = r.pipeline(transaction=False)
    plan = [(name, key) for name in STREAMS for key in stream_keys(k, name)]  # events and dead: a stream per role
    for _, key in plan:
        pipe.xlen(key)
    lengths = dict.fromkeys(STREAMS, 0)
    for (name, _), n in zip(plan, pipe.execute()):
        lengths[name] += n
    return {"used_memory": int(mem["used_memory"]), "net_bytes": int(stats["total_net_input_bytes"]) + int(stats["total_net_output_bytes"]), "streams": lengths}


def last_entry_time(r, stream: str) -> float | None:
    """When the last entry of `stream` was added (the server's clock, seconds since the epoch):
    the millisecond part of its last-generated-id, which trimming keeps."""
    try:
        last = r.xinfo_stream(stream)["last-generated-id"]
    except Exception:  # noqa: BLE001 — no such stream yet
        return None
    return int((last.decode() if isinstance(last, bytes) else last).split("-")[0]) / 1000


def weight_fanout(loads_per_pod: float, pods: int, model_bytes: float, gpus_per_pod: int) -> dict[str, dict[str, float]]:
    """Bytes a step's new weights move, per transport, when `pods` rollout pods each load
    `loads_per_pod` versions a step (measured: 1) of `model_bytes` (the published dtype), by the
    three places that carry them: the shared volume, the learner's network link, each pod's link.
    filesystem: written once to the volume, read by every pod from it. http: written to the
    learner's own disk, downloaded by every pod from the learner. nccl: one broadcast — the root
    sends each byte once (NCCL pipelines it along a ring/tree of the members; every vLLM GPU of a
    pod receives the full tensors), plus the background snapshot on the volume for pods outside
    the group (services/magic/weights/nccl.py)."""
    n = loads_per_pod * pods
    return {
        "filesystem": {"volume": model_bytes * (1 + n), "learner_link": model_bytes, "pod_link": model_bytes * loads_per_pod},
        "http": {"volume": 0.0, "learner_link": model_bytes * n, "pod_link": model_bytes * loads_per_pod},
        "nccl": {"volume": model_bytes, "learner_link": model_bytes * loads_per_pod, "pod_link": model_bytes * loads_per_pod * gpus_per_pod},
    }


def run(args) -> dict:
    import httpx
    import redis

    from magic.demo.prepare import build_model
    from magic.local.redis_server import RedisServer
    from magic.runtime.ports import free_port
    from magic.local.supervisor import Supervisor
    from magic.protocol import keys

    tmp = Path(args.workdir or tempfile.mkdtemp(prefix="magic-paper-scale-"))
    model = tmp / "model"
    build_model(model, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=args.max_tokens + 1024)  # only its config and tokenizer are used
    data = tmp / "train.jsonl"
    _dataset(data, args.groups * (args.steps + 1))
    held = tmp / "held.jsonl"
    _dataset(held, args.validation_prompts)
    server = RedisServer(maxmemory=args.maxmemory, appendfsync=args.appendfsync).start()
    r = redis.Redis.from_url(server.url)
    port = free_port()
    busy_dir = tmp / "busy"
    busy_dir.mkdir(exist_ok=True)
    base = {"MAGIC_REDIS_URL": server.url, "MAGIC_DATA_DIR": str(tmp / "data"), "MAGIC_TORCH_THREADS": "1", "MAGIC_LOG_LEVEL": "WARNING",
            "MAGIC_BENCH_BUSY_DIR": str(busy_dir)}
    sup = Supervisor(tmp / "logs", base)
    procs: list[subprocess.Popen] = []
    me = [sys.executable, str(Path(__file__).resolve()), "--generation-seconds", str(args.generation_seconds),
          "--train-seconds", str(args.train_seconds), "--vocab", str(args.vocab), "--groups", str(args.groups),
          "--group-size", str(args.group_size), "--max-tokens", str(args.max_tokens)]
    try:
        sup.start("controller", "magic.controller", {"MAGIC_PORT": str(port), "MAGIC_STEP_TIMEOUT_SECONDS": "7200",
                                                     "MAGIC_TRIM_STREAMS": "false" if args.keep_streams else "true"})
        for i in range(args.reward_workers):
            sup.start(f"reward-{i}", "magic.reward", {"MAGIC_MATH__WORKERS": str(args.reward_processes)} if args.reward_processes else {})
        env = {**os.environ, **base, "PYTHONUNBUFFERED": "1"}
        per_worker = -(-args.groups * args.group_size // args.rollout_workers)
        for i in range(args.rollout_workers):
            log = (tmp / "logs" / f"rollout-{i}.log").open("ab")
            procs.append(subprocess.Popen(me + ["--role", "rollout"], env={**env, "MAGIC_WORKER_NAME": f"rollout-{i}", "MAGIC_MAX_BATCH_SEQUENCES": str(per_worker)},
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        log = (tmp / "logs" / "learner.log").open("ab")
        procs.append(subprocess.Popen(me + ["--role", "learner"], env={**env, "MAGIC_WORKER_NAME": "learner", "MAGIC_CHECKPOINT_EVERY": "0",
                                                                      "MAGIC_STREAM": "true" if args.stream else "false"},
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        deadline = time.monotonic() + 300
        while True:
            try:
                if api.get("/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or sup.first_exit():
                raise RuntimeError("the controller did not start; logs in " + str(tmp / "logs"))
            time.sleep(0.2)
        spec = {"name": RUN, "model": str(model), "train_files": [str(data)],
                "stages": [{"name": "paper", "steps": args.steps, "T": args.max_tokens, "D_R": args.groups, "gs": args.group_size, "lr": 1e-6,
                                                                           "max_staleness": args.max_staleness}]}
        if args.validation_every:
            resp = api.post("/v1/datasets", json={"name": "held", "path": str(held)})
            if resp.status_code != 201:
                raise RuntimeError(f"the controller refused the held-out dataset: {resp.status_code} {resp.text}")
            spec["validation"] = {"datasets": ["held"], "every": args.validation_every, "samples": args.validation_samples}
        resp = api.post("/v1/runs", json=spec)
        if resp.status_code != 201:
            raise RuntimeError(f"the controller refused the run: {resp.status_code} {resp.text}")
        k = keys.RunKeys(RUN)
        per_token = seconds_per_token(args.train_seconds, args.groups, args.group_size, args.max_tokens)
        print(f"D_R={args.groups} gs={args.group_size} T={args.max_tokens} steps={args.steps}; stand-in generation {args.generation_seconds}s, "
              f"training {args.train_seconds}s ({'streamed: each group as it arrives' if args.stream else 'the whole batch at the end'}), max_staleness {args.max_staleness}; {args.rollout_workers} rollout, {args.reward_workers} reward worker(s); Redis maxmemory {args.maxmemory}, "
              f"appendfsync {args.appendfsync or '(no AOF)'}; logs {tmp / 'logs'}")
        print(f"{'step':>4} {'total s':>8} {'rollout':>8} {'train':>6} {'sync':>6} {'other':>6} {'orch %':>7} {'redis MB':>9} {'peak MB':>8} "
              f"{'through MB':>10} {'reward/s':>9} {'val s':>6} {'wall s':>7} {'fleet %':>7} {'learner %':>9} {'stale':>6}  streams (prompts rollouts scored events weights dead)")
        steps: list[dict] = []
        served = {}  # rollout worker -> the version it serves (the weight_versions hash): a change is one load
        before = _redis_figures(r, k)
        peak = before["used_memory"]
        status = "running"
        t_run = time.monotonic()
        last_time, last_busy = time.time(), (0.0, 0.0)  # the previous record's time; the stand-ins' busy seconds then
        while len(steps) < args.steps:
            time.sleep(0.25)
            fig = _redis_figures(r, k)
            peak = max(peak, fig["used_memory"])
            records = api.get(f"/v1/runs/{RUN}/metrics").json()
            for rec in records[len(steps):]:
                fig = _redis_figures(r, k)
                total = rec["step_seconds_total"]
                # generation: the stand-in fleet's time for the step (its longest response); training: the stand-in's sleep
                generation = args.generation_seconds * rec.get("longest_response", args.max_tokens) / args.max_tokens
                training = per_token * rec.get("tokens_trained", 0)  # the stand-in's time for this step's tokens
                # barrier: generation then training; streaming or s >= 1: training overlaps generation, the step's floor is the longer of the two
                floor = max(generation, training) if args.stream or args.max_staleness else generation + training
                # the time between two records: with s >= 1 steps overlap and `total` (publish -> record) counts the overlap twice
                wall = rec["time"] - last_time if steps else total
                busy = (busy_seconds(busy_dir, "rollout") / args.rollout_workers, busy_seconds(busy_dir, "learner"))
                fleet, learner = ((b - a) / wall if wall > 0 else 0.0 for a, b in zip(last_busy, busy))
                last_time, last_busy = rec["time"], busy
                orch = max(0.0, (wall if args.max_staleness else total) - floor)
                row = {
                    "step": rec["step"], "total_s": total, "rollout_s": rec["step_seconds_rollout"], "train_s": rec["step_seconds_train"],
                    "sync_s": rec["step_seconds_weight_sync"], "other_s": rec["step_seconds_other"], "orchestration_s": orch,
                    "orchestration_fraction": orch / total if total else 0.0, "redis_used_bytes": fig["used_memory"], "redis_peak_bytes": peak,
                    "generation_s": generation, "training_s": training, "over_max": total / max(generation, training, 1e-9),
                    "bytes_through_redis": fig["net_bytes"] - before["net_bytes"], "streams": fig["streams"],
                    "samples": rec.get("samples", 0), "distinct_groups": rec.get("distinct_groups", 0), "version_mismatch": rec.get("version_mismatch", 0),
                    "tokens": rec.get("tokens_trained", 0), "reward_samples_per_s": rec.get("samples", 0) / max(1e-9, rec["step_seconds_rollout"]),
                    # wall time of the held-out validation of this step's policy version, run before the step
                    "validation_s": (rec.get("validation") or {}).get("held", {}).get("seconds"),
                    "wall_s": wall, "fleet_busy": min(1.0, fleet), "learner_busy": min(1.0, learner), "samples_stale": rec.get("samples_stale", 0),
                }
                # where the tail goes (s = 0 only: then step k's last rollout and scored group are the
                # streams' last entries when its record is read): the rollout worker's publishing after the
                # stand-in generation ends, the reward service's scoring of the last groups, and the learner's
                # part (reading, decoding, training what is left, the weight sync, the record)
                last_rollout, last_scored = last_entry_time(r, k.rollouts), last_entry_time(r, k.scored)
                if not args.max_staleness and last_rollout and last_scored and not args.validation_every:
                    row["tail_publish_s"] = last_rollout - (rec["time"] - total + generation)
                    row["tail_reward_s"] = last_scored - last_rollout
                    row["tail_learner_s"] = rec["time"] - last_scored
                now = {w.decode(): int(v) for w, v in r.hgetall(k.weight_versions).items()}
                row["weight_loads"] = sum(1 for w, v in now.items() if served.get(w) != v)
                served = now
                steps.append(row)
                s = fig["streams"]
                print(f"{row['step']:>4} {total:>8.2f} {row['rollout_s']:>8.2f} {row['train_s']:>6.2f} {row['sync_s']:>6.2f} {row['other_s']:>6.2f} "
                      f"{100 * row['orchestration_fraction']:>6.2f}% {row['redis_used_bytes'] / 2**20:>9.1f} {peak / 2**20:>8.1f} "
                      f"{row['bytes_through_redis'] / 2**20:>10.1f} {row['reward_samples_per_s']:>9.1f} "
                      f"{'-' if row['validation_s'] is None else format(row['validation_s'], '.2f'):>6} {wall:>7.2f} {100 * row['fleet_busy']:>6.1f}% "
                      f"{100 * row['learner_busy']:>8.1f}% {row['samples_stale']:>6.0f}  "
                      + " ".join(str(s[n]) for n in STREAMS)
                      + ("  tail: publish {tail_publish_s:.2f}s reward {tail_reward_s:.2f}s learner {tail_learner_s:.2f}s".format(**row) if "tail_reward_s" in row else ""), flush=True)
                before, peak = fig, fig["used_memory"]
            status = api.get(f"/v1/runs/{RUN}").json()["status"]
            if status in ("failed", "stopped") or sup.first_exit() or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"the run stopped (status {status}); logs in {tmp / 'logs'}")
        wall = time.monotonic() - t_run
        final = _redis_figures(r, k)
        expected = args.groups * args.group_size
        lost = [s["step"] for s in steps if s["samples"] != expected or s["distinct_groups"] != args.groups]
        summary = {
            "args": vars(args), "steps": steps, "wall_seconds": wall, "dead_letters": final["streams"]["dead"],
            "lost_steps": lost, "version_mismatch": sum(s["version_mismatch"] for s in steps),
            "redis_used_bytes_first": steps[0]["redis_used_bytes"], "redis_used_bytes_last": steps[-1]["redis_used_bytes"],
            "redis_peak_bytes": max(s["redis_peak_bytes"] for s in steps),
            "validation_seconds": [s["validation_s"] for s in steps if s["validation_s"] is not None],
        }
        mb = 2**20
        tokens = sum(s["tokens"] for s in steps) / len(steps)
        later = steps[1:] or steps  # step 0 includes the fleet's start
        if args.max_staleness and len(steps) >= 3:
            later = steps[1:-1]  # the last step has no next one to overlap with
        mean = {key: sum(s[key] for s in later) / len(later) for key in ("generation_s", "training_s", "wall_s", "total_s", "orchestration_s", "fleet_busy", "learner_busy")}
        summary["mean_after_first"] = mean
        print(f"\ngeneration {mean['generation_s']:.1f}s, training {mean['training_s']:.1f}s, "
              f"{mean['wall_s']:.1f}s between step records after the first ({mean['total_s']:.1f}s from publish to record): "
              f"{mean['wall_s'] / max(mean['generation_s'], mean['training_s'], 1e-9):.2f} x max(generation, training), "
              f"orchestration {mean['orchestration_s']:.2f}s; rollout fleet busy {100 * mean['fleet_busy']:.0f}%, learner busy {100 * mean['learner_busy']:.0f}%; "
              f"{3600 / mean['wall_s']:.1f} steps/h")
        print(f"{len(steps)} steps in {wall:.0f}s; Redis used {summary['redis_used_bytes_first'] / mb:.1f} MB after step 0, "
              f"{summary['redis_used_bytes_last'] / mb:.1f} MB after the last, peak {summary['redis_peak_bytes'] / mb:.1f} MB; "
              f"{sum(s['bytes_through_redis'] for s in steps) / len(steps) / mb:.0f} MB through Redis per step "
              f"({tokens / 1e6:.1f}M response tokens per step); "
              f"orchestration {100 * sum(s['orchestration_s'] for s in steps) / sum(s['total_s'] for s in steps):.2f}% of step time; "
              f"dead letters {summary['dead_letters']}; groups lost in steps {lost or 'none'}; version mismatches {summary['version_mismatch']:.0f}")
        later = steps[1:] or steps  # step 0's loads include each worker's bootstrap of version 0
        loads_per_pod = sum(s["weight_loads"] for s in later) / len(later) / args.rollout_workers
        summary["weight_loads_per_pod_step"] = loads_per_pod
        summary["weight_fanout"] = {n: weight_fanout(loads_per_pod, n, args.model_bytes, args.gpus_per_pod) for n in (args.rollout_workers, args.fanout_pods)}
        gb = 1e9
        print(f"weight loads per rollout worker per step: {loads_per_pod:.2f} (measured). New weights of {args.model_bytes / gb:.1f} GB a step, "
              f"moved per step by transport ({args.gpus_per_pod} GPUs per rollout pod):")
        print(f"{'pods':>5} {'transport':>11} {'volume GB':>10} {'learner link GB':>16} {'each pod GB':>12}")
        for n, table in summary["weight_fanout"].items():
            for name, row in table.items():
                print(f"{n:>5} {name:>11} {row['volume'] / gb:>10.1f} {row['learner_link'] / gb:>16.1f} {row['pod_link'] / gb:>12.1f}")
        if summary["validation_seconds"]:
            val = summary["validation_seconds"]
            mean_step = sum(s["total_s"] for s in steps) / len(steps)
            print(f"validation ({args.validation_prompts} prompts x {args.validation_samples} samples, T={args.max_tokens}): {sum(val) / len(val):.1f}s mean over "
                  f"{len(val)} validations = {sum(val) / len(val) / mean_step:.2f}x a step ({mean_step:.1f}s); every {args.validation_every} steps: "
                  f"+{100 * sum(val) / len(val) / mean_step / args.validation_every:.1f}% wall time")
        return summary
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        sup.stop_all()
        r.close()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=("driver", "rollout", "learner"), default="driver", help=argparse.SUPPRESS)
    ap.add_argument("--groups", type=int, default=256, help="D_R: prompt groups per step")
    ap.add_argument("--group-size", type=int, default=16, help="gs: samples per group")
    ap.add_argument("--max-tokens", type=int, default=16384, help="T: longest response")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--generation-seconds", type=float, default=60.0, help="time the stand-in fleet takes for a group whose longest response is T tokens")
    ap.add_argument("--train-seconds", type=float, default=5.0, help="the stand-in learner's step on a batch of the expected size (it grows with the tokens)")
    ap.add_argument("--stream", action="store_true", help="the learner trains each group as it arrives (MAGIC_STREAM; default: the whole batch at the end)")
    ap.add_argument("--max-staleness", type=int, default=0, help="s: the stage's bounded staleness (0: the recipe's barrier; 1: step k + 1 generated while step k trains)")
    ap.add_argument("--rollout-workers", type=int, default=1)
    ap.add_argument("--reward-workers", type=int, default=1)
    ap.add_argument("--reward-processes", type=int, default=0, help="verifier processes of each reward worker, MAGIC_MATH__WORKERS (0: one per core)")
    ap.add_argument("--vocab", type=int, default=151_936, help="token ids are drawn below this (Qwen2.5's vocabulary)")
    ap.add_argument("--maxmemory", default="3gb", help="Redis maxmemory (the chart's default)")
    ap.add_argument("--appendfsync", choices=("always", "everysec", "no"), default=None,
                    help="run Redis with an append-only file fsynced this way (default: none, as `magic local`); the chart's is everysec")
    ap.add_argument("--keep-streams", action="store_true", help="run the controller with MAGIC_TRIM_STREAMS=false (for comparison)")
    ap.add_argument("--model-bytes", type=float, default=15.2e9, help="bytes of one published policy version for the fan-out figures (7.6B params in bf16)")
    ap.add_argument("--fanout-pods", type=int, default=64, help="rollout pods the fan-out figures are stated for")
    ap.add_argument("--gpus-per-pod", type=int, default=2, help="vLLM GPUs per rollout pod (tensor parallel) for the nccl figures")
    ap.add_argument("--validation-every", type=int, default=0, help="validate every this many steps (0: no validation)")
    ap.add_argument("--validation-prompts", type=int, default=30, help="held-out prompts (AIME24: 30)")
    ap.add_argument("--validation-samples", type=int, default=32, help="samples per held-out prompt (the paper's avg@32)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None, help="write the per-step figures here")
    args = ap.parse_args(argv)
    if args.role == "rollout":
        return serve_rollout(args)
    if args.role == "learner":
        return serve_learner(args)
    summary = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    ok = not summary["lost_steps"] and summary["dead_letters"] == 0 and summary["version_mismatch"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
