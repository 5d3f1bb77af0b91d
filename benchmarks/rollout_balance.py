"""Step time with skewed response lengths: dynamic pulling vs a static split, 2 rollout processes.

    .venv/bin/python benchmarks/rollout_balance.py            # 32 groups x 4 samples, 1 in 4 long
    .venv/bin/python benchmarks/rollout_balance.py --groups 16 --long-tokens 128

One on-policy step's prompt groups go to two real rollout processes (`python -m magic.rollout`,
torch engine, 1 thread each, a random tiny Qwen2 model) over a private redis-server. Response
lengths are skewed through each group's max_tokens (the random model rarely stops early): a
quarter of the groups are long, the rest short, and the long ones come first — as when a step
draws a cluster of hard prompts. Step time = from announcing the step's weights (the groups already queued) until the last one is
published to `rollouts`.

  dynamic           the workers pull groups from the shared queue as their batch has room
  static contiguous the first half of the groups is assigned to worker 0, the rest to worker 1
  static round-robin groups assigned alternately (the best a static split can do blindly)

A static split is made by delivering each worker's share to it before it starts (its pending
entries, which it reads first); straggler takeover is off so the split stays static.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path


def run_case(name: str, assign, args, model_dir: Path, scratch: Path) -> float:
    import redis

    from magic import modeling
    from magic.local.redis_server import RedisServer
    from magic.local.supervisor import Supervisor
    from magic.protocol import codec, keys
    from magic.protocol.pb import messages_pb2 as pb
    from magic.store.channels import RunChannels
    from magic.store.streams import Stream
    from magic.weights import make_sender
    from magic.weights.config import FilesystemTransportConfig

    server = RedisServer().start()
    r = redis.Redis.from_url(server.url)
    k = keys.RunKeys("bench")
    spec = {"name": "bench", "model": str(model_dir), "train_files": ["unused.jsonl"], "stages": [{"steps": 1, "T": args.long_tokens, "D_R": args.groups, "gs": args.n}]}
    r.set(k.spec, json.dumps(spec))
    model = modeling.load_model(model_dir)
    sender = make_sender(FilesystemTransportConfig(), channels=RunChannels(r, "bench", "learner"), root=scratch / name / "weights",
                         config_json=model.config.to_json_string(), keep=2)
    r.xgroup_create(k.prompts, "rollout", id="0", mkstream=True)
    for i in range(args.groups):
        long = i < args.groups // 4
        g = pb.PromptGroup(run_id="bench", group_id=f"0:{i:05d}", step=0, policy_version=0,
                           sampling=pb.SamplingParams(n=args.n, temperature=1.0, top_p=1.0, max_tokens=args.long_tokens if long else args.short_tokens, seed=i))
        g.messages.add(role="user", content=f"Add {i}+{i}")
        r.xadd(k.prompts, codec.encode(g))
    if assign is not dynamic:  # deliver each entry once to its assigned worker (XREADGROUP delivers in order)
        ids = [e[0].decode() for e in r.xrange(k.prompts)]
        shares = assign(ids)
        for entry_id in ids:
            worker = next(w for w, share in shares if entry_id in share)
            r.xreadgroup("rollout", worker, {k.prompts: ">"}, count=1)
    r.set(keys.ACTIVE_RUN, "bench")
    env = {"MAGIC_REDIS_URL": server.url, "MAGIC_DATA_DIR": str(scratch / name), "MAGIC_TORCH_THREADS": "1", "MAGIC_LOG_LEVEL": "WARNING",
           "MAGIC_MAX_BATCH_SEQUENCES": str(args.batch), "MAGIC_STRAGGLER_SECONDS": "100000", "OMP_NUM_THREADS": "1"}
    sup = Supervisor(scratch / name / "logs", env)
    try:
        for i in range(2):
            sup.start(f"rollout-{i}", "magic.rollout")
        from magic.store.heartbeat import alive_workers

        while len([w for w in alive_workers(r, "rollout").values() if w.get("run") == "bench"]) < 2:  # both attached
            assert sup.first_exit() is None, sup.first_exit().log_tail()
            time.sleep(0.05)
        t0 = time.perf_counter()  # both wait for weights: the step starts when v0 is announced
        sender.publish(0, modeling.export_state_dict(model))
        while r.xlen(k.rollouts) < args.groups:
            dead = sup.first_exit()
            assert dead is None, dead.log_tail()
            time.sleep(0.02)
        seconds = time.perf_counter() - t0
        per_worker = {}
        for _, g in Stream(r, k.rollouts).read_after("0", pb.RolloutGroup, count=10_000):
            per_worker.setdefault(g.worker, [0, 0])
            per_worker[g.worker][0] += 1
            per_worker[g.worker][1] += sum(len(s.response_ids) for s in g.samples)
        print(f"{name:>19}: step {seconds:6.2f}s   groups/tokens per worker {per_worker}", flush=True)
        return seconds
    finally:
        sup.stop_all()
        sender.close()
        server.stop()


def dynamic(ids):
    return []


def static_contiguous(ids):
    return [("rollout-0", set(ids[: len(ids) // 2])), ("rollout-1", set(ids[len(ids) // 2 :]))]


def static_round_robin(ids):
    return [("rollout-0", set(ids[0::2])), ("rollout-1", set(ids[1::2]))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=32, help="prompt groups in the step (default 32)")
    parser.add_argument("--n", type=int, default=4, help="samples per group, gs (default 4)")
    parser.add_argument("--long-tokens", type=int, default=160, help="max tokens of the long groups (default 160)")
    parser.add_argument("--short-tokens", type=int, default=16, help="max tokens of the short groups (default 16)")
    parser.add_argument("--batch", type=int, default=16, help="max sequences in flight per worker (default 16)")
    args = parser.parse_args()

    import torch

    from magic.demo.prepare import build_model

    Path(".magic").mkdir(exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-balance-", dir=".magic"))
    try:
        torch.manual_seed(0)
        build_model(scratch / "model", seed=0, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        print(f"{args.groups} groups x {args.n} samples, a quarter long ({args.long_tokens} tokens, first) and the rest short ({args.short_tokens}); "
              f"2 rollout processes, {args.batch} sequences in flight each", flush=True)
        for name, assign in (("dynamic", dynamic), ("static contiguous", static_contiguous), ("static round-robin", static_round_robin)):
            run_case(name, assign, args, scratch / "model", scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
