"""Time to push one policy version to 2 rollout processes through each CPU weight transport.

    .venv/bin/python benchmarks/weights_push.py                # ~0.5B parameters (2 GB in fp32)
    .venv/bin/python benchmarks/weights_push.py --params 50e6  # quick

A state dict of random fp32 weights (Qwen2-0.5B-like shapes, scaled to --params) is published by
the learner-side sender of each transport; two separate receiver processes follow the run's
`weights` stream (a private redis-server), fetch and verify the version with their transport's
receiver, and read every tensor (as loading into a model would). Reported next to a raw copy of
the same bytes on the same disk (`shutil.copyfile` + fsync, once and twice). Push time = from
`publish()` until both receivers have the version; publish = the sender's own part (write,
fsync, checksum). Figures depend on the disk, its page cache and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def state_dict(params: float) -> dict[str, torch.Tensor]:
    """Random fp32 tensors with transformer-like shapes totalling about `params` parameters."""
    hidden, vocab = 896, 151_936
    out = {"model.embed_tokens.weight": torch.randn(vocab, hidden)}
    per_layer = 4 * hidden * hidden + 3 * hidden * 4864
    layer = 0
    while sum(t.numel() for t in out.values()) + per_layer <= params:
        p = f"model.layers.{layer}."
        for name, shape in (("self_attn.q_proj.weight", (hidden, hidden)), ("self_attn.k_proj.weight", (hidden, hidden)),
                            ("self_attn.v_proj.weight", (hidden, hidden)), ("self_attn.o_proj.weight", (hidden, hidden)),
                            ("mlp.gate_proj.weight", (4864, hidden)), ("mlp.up_proj.weight", (4864, hidden)), ("mlp.down_proj.weight", (hidden, 4864))):
            out[p + name] = torch.randn(*shape)
        layer += 1
    return out


def receiver_main(args) -> None:
    """A rollout process: receive each announced version, read every tensor, report in Redis."""
    import redis
    from safetensors import safe_open

    from magic.protocol import keys
    from magic.protocol.pb import messages_pb2 as pb
    from magic.rollout.settings import RolloutSettings
    from magic.store.streams import Stream
    from magic.weights import WEIGHTS_FILE, make_receiver

    r = redis.Redis.from_url(args.redis)
    config = RolloutSettings.model_validate({"weight_transport": json.loads(args.transport)}).weight_transport
    receiver = make_receiver(config, worker_name=args.name, cache_dir=Path(args.cache))

    class Loader:
        version = -1

        def load_checkpoint(self, checkpoint):
            with safe_open(str(checkpoint.directory / WEIGHTS_FILE), "pt") as f:
                for key in f.keys():
                    f.get_tensor(key)  # materialise every tensor, one at a time
            self.version = checkpoint.version

    loader, cursor = Loader(), "0"
    while True:
        updates = Stream(r, keys.RunKeys("bench").weights).read_after(cursor, pb.WeightUpdate, block_ms=1000)
        if updates:
            cursor = updates[-1][0]
            receiver.receive_batch([u for _, u in updates], loader)
            r.hset("bench:done", args.name, json.dumps({"version": loader.version, "at": time.time()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=float, default=0.5e9, help="parameters in the state dict (default 0.5e9)")
    parser.add_argument("--dir", default=None, help="scratch directory on the disk to measure (default: a temp dir under .magic/)")
    parser.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--redis", help=argparse.SUPPRESS)
    parser.add_argument("--transport", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receiver:
        return receiver_main(args)

    import redis

    from magic.learner.settings import LearnerSettings
    from magic.local.redis_server import RedisServer
    from magic.protocol import keys
    from magic.store.channels import RunChannels
    from magic.store.streams import Stream
    from magic.weights import make_sender

    Path(".magic").mkdir(exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-weights-", dir=args.dir or ".magic"))
    server = RedisServer().start()
    r = redis.Redis.from_url(server.url)
    torch.manual_seed(0)
    state = state_dict(args.params)
    n_params = sum(t.numel() for t in state.values())
    print(f"state dict: {n_params / 1e6:.0f}M parameters, {n_params * 4 / 2**30:.2f} GiB fp32; scratch {scratch}", flush=True)
    rows = []
    try:
        for transport in ({"type": "filesystem"}, {"type": "http", "host": "127.0.0.1", "port": 0, "advertise_url": None}):
            r.flushall()
            config = LearnerSettings.model_validate({"weight_transport": transport}).weight_transport
            sender = make_sender(config, channels=RunChannels(r, "bench", "learner"), root=scratch / transport["type"] / "learner",
                                 config_json="{}", keep=2)
            wire = dict(transport)
            if transport["type"] == "http":
                sender.base_url = f"http://127.0.0.1:{sender.server.port}"
            procs = [
                subprocess.Popen([sys.executable, __file__, "--receiver", "--name", f"rollout-{i}", "--redis", server.url, "--transport", json.dumps(wire),
                                  "--cache", str(scratch / transport["type"] / f"cache-{i}")], env={**os.environ, "OMP_NUM_THREADS": "1"})
                for i in range(2)
            ]
            try:
                for version in range(2):  # version 0 warms the receivers up; version 1 is measured
                    t0 = time.time()
                    p0 = time.perf_counter()
                    sender.publish(version, state)
                    publish = time.perf_counter() - p0
                    while True:
                        done = {k.decode(): json.loads(v) for k, v in r.hgetall("bench:done").items()}
                        if len(done) == 2 and all(d["version"] == version for d in done.values()):
                            break
                        assert all(p.poll() is None for p in procs), "a receiver died"
                        time.sleep(0.01)
                    push = max(d["at"] for d in done.values()) - t0
                rows.append((transport["type"], publish, push))
                print(f"{transport['type']:>10}: publish {publish:6.2f}s  push to 2 rollout processes {push:6.2f}s", flush=True)
            finally:
                for p in procs:
                    p.terminate()
                    p.wait()
                sender.close()
        src = next((scratch / "filesystem" / "learner").glob("v*/model.safetensors"))
        for copies in (1, 2):
            t0 = time.perf_counter()
            for i in range(copies):
                dst = scratch / f"raw-{i}.bin"
                shutil.copyfile(src, dst)
                fd = os.open(dst, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
            print(f"{'raw copy':>10}: {copies} copy of the same {src.stat().st_size / 2**30:.2f} GiB file (copyfile + fsync) {time.perf_counter() - t0:6.2f}s", flush=True)
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
