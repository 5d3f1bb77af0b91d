"""The learner's memory plan (`magic.learner.memory`) against the measured peak memory of DeepSpeed ranks on CPU.

    .venv/bin/python benchmarks/learner_memory.py                    # the three default shapes (≈ 10 min on 2 cores)
    .venv/bin/python benchmarks/learner_memory.py --shapes 1:2:fp32:0:1024
    .venv/bin/python benchmarks/learner_memory.py --calibrate        # the activation constants, one process
    .venv/bin/python benchmarks/learner_memory.py --measured runs.json   # the plan against a saved --json run's measurements
    .venv/bin/python benchmarks/learner_memory.py --gpu-table        # docs/learner.md's 7B/32B table (computed)

A randomly initialised Qwen2-shaped model of 0.51B parameters (`MODEL`; built once into
--model-dir, float32 safetensors) is trained by W rank processes (gloo,
`DS_ACCELERATOR=cpu`) exactly as the learner loads and trains it: `DeepSpeedBackend.load_policy`
(ZeRO-3: partitioned from construction, each rank reading its own share of the files; ZeRO-1/2:
the replica in the training precision), `DeepSpeedBackend`, then two optimizer steps on one
micro-batch of N tokens per rank (forward, backward, step: the second step runs with the AdamW
state allocated, as every step of a run does). Each rank reports its resident high-water mark
(VmHWM: weights, gradients, optimizer partitions, activations, logits, the Python runtime, all
host memory on CPU); then the weights are gathered for publishing bucket by bucket and rank 0's
high-water mark over that phase is reported against one bucket.

The table prints the plan's prediction per rank (components and total, without the publish
bucket) beside the largest measured peak of any rank, and the relative error; the run exits
non-zero when an error exceeds --tolerance (15%). Shapes are W:ZeRO:precision:checkpointing:N.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "services"))

from _proc import status_bytes  # noqa: E402  (benchmarks/ is the script's directory)

MODEL = dict(
    hidden_size=1024, num_hidden_layers=42, num_attention_heads=16, num_key_value_heads=4, intermediate_size=2816,
    vocab_size=32000, tie_word_embeddings=True, max_position_embeddings=4096,
)
"""0.51B parameters in Qwen2 layers (Qwen1.5-0.5B's widths, 42 layers, a 32k vocabulary): four ranks
of it, each with its float32 masters and AdamW moments, fit this 24 GiB machine."""
DEFAULT_SHAPES = ["1:2:fp32:0:1024", "2:3:bf16:1:2048", "4:3:bf16:0:512"]


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5": reset the resident high-water mark
        f.write("5")


def build_model(out: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if (out / "model.safetensors").is_file():
        return
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**MODEL))
    model.save_pretrained(out, safe_serialization=True)
    print(f"built {sum(p.numel() for p in model.parameters()) / 1e9:.3f}B parameters into {out}", flush=True)


def rank_main(model_dir: str, out: str, zero: int, precision: str, checkpointing: bool, tokens: int) -> None:
    import torch

    from magic.config.schema import OptimConfig
    from magic.learner import backends

    torch.set_num_threads(1)
    device = torch.device("cpu")
    rank, world = backends.init_distributed(device, 3600)
    runtime = status_bytes("VmRSS")
    model = backends.DeepSpeedBackend.load_policy(model_dir, device, zero, precision)
    loaded = status_bytes("VmHWM")
    backend = backends.DeepSpeedBackend(model, OptimConfig(max_grad_norm=1.0), device, zero, chunk_size=1024, precision=precision, activation_checkpointing=checkpointing)
    g = torch.Generator().manual_seed(rank)
    phases = {"runtime": runtime, "load peak": loaded, "engine": status_bytes("VmRSS")}
    t0 = time.perf_counter()
    for i in range(2):
        ids = torch.randint(3, MODEL["vocab_size"], (1, tokens), generator=g)
        mask = torch.ones_like(ids)
        backend.train(True)
        reset_peak()
        logp, entropy = backend.forward(ids, mask, 1.0)
        loss = -(logp.sum() + 1e-3 * entropy.sum()) / (tokens * world)
        backend.backward(loss, last=True)
        phases[f"fwd+bwd{i} peak"] = status_bytes("VmHWM")
        del logp, entropy, loss
        reset_peak()
        backend.step(1e-6, 1.0)
        phases[f"step{i} peak"] = status_bytes("VmHWM")
        phases[f"after step{i}"] = status_bytes("VmRSS")
    step_seconds = (time.perf_counter() - t0) / 2
    train_peak = max(v for k, v in phases.items() if k.endswith("peak"))
    torch.distributed.barrier()
    reset_peak()
    before_publish = status_bytes("VmRSS")
    published = 0
    for bucket in backend.state_dict_buckets(backends.PUBLISH_BUCKET_BYTES):
        if bucket is not None:
            published += sum(v.numel() * v.element_size() for v in bucket.values())
    publish_peak = status_bytes("VmHWM") - before_publish
    result = dict(rank=rank, phases=phases, runtime=runtime, loaded=loaded, train_peak=train_peak, publish_extra=publish_peak, published=published, step_seconds=step_seconds)
    Path(f"{out}.{rank}").write_text(json.dumps(result))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_shape(model_dir: Path, spec: str, work: Path) -> dict:
    world, zero, precision, ckpt, tokens = spec.split(":")
    world, zero, tokens, ckpt = int(world), int(zero), int(tokens), ckpt == "1"
    port = _free_port()
    out = work / spec.replace(":", "_")
    procs = []
    t0 = time.perf_counter()
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "services"))
        cmd = [sys.executable, __file__, "--rank", str(model_dir), str(out), str(zero), precision, str(int(ckpt)), str(tokens)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"shape {spec} failed:\n" + "\n".join(x[-3000:] for x in logs))
    ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]
    return dict(spec=spec, world=world, zero=zero, precision=precision, ckpt=ckpt, tokens=tokens, ranks=ranks, seconds=time.perf_counter() - t0)


def predict(model_dir: Path, r: dict) -> dict[str, int]:
    from magic.learner import memory

    model = memory.ModelShape.from_path(model_dir)
    shape = memory.LearnerShape(
        gpus=r["world"], nodes=1, backend="deepspeed", zero_stage=r["zero"], precision=r["precision"], activation_checkpointing=r["ckpt"],
        micro_batch_tokens=r["tokens"], sequence_tokens=r["tokens"], logprob_chunk_size=1024, device="cpu", device_bytes=None,
    )
    return memory.per_rank_components(model, shape, rank0=False)


def calibrate(args: argparse.Namespace) -> None:
    """Saved activation bytes per token of one decoder layer, and of the chunked log-probs, in
    fresh processes (the constants of `magic.learner.memory`)."""
    for h, i in ((896, 4864), (1536, 2048)):
        for precision in ("fp32", "bf16"):
            for ckpt in (False, True):
                cmd = [sys.executable, __file__, "--calibrate-one", str(h), str(i), precision, str(int(ckpt)), str(args.calibrate_tokens)]
                print(subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "services"))).stdout.strip(), flush=True)


def calibrate_one(h: int, i: int, precision: str, ckpt: bool, n: int, layers: int = 4, vocab: int = 1024) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from magic import modeling

    torch.set_num_threads(2)
    cfg = Qwen2Config(hidden_size=h, intermediate_size=i, num_hidden_layers=layers, num_attention_heads=h // 64, num_key_value_heads=2, vocab_size=vocab, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg).to(dict(fp32=torch.float32, bf16=torch.bfloat16)[precision]).train()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    w = torch.randint(0, vocab, (1, 8))
    lp, en = modeling.token_logprobs(model, w, torch.ones_like(w), 1.0, chunk_size=1024)
    (lp.sum() + en.sum()).backward()  # gradients allocated: what remains is activations
    base = status_bytes("VmRSS")
    reset_peak()
    ids = torch.randint(0, vocab, (1, n))
    lp, en = modeling.token_logprobs(model, ids, torch.ones_like(ids), 1.0, chunk_size=1024)
    (lp.sum() + en.sum()).backward()
    peak = status_bytes("VmHWM") - base
    print(f"h={h} i={i} {precision} checkpointing={'on' if ckpt else 'off'} N={n}: peak {peak / 2**20:.0f} MiB, {peak / n / layers:.0f} bytes per token per layer")


def gpu_table() -> None:
    """The memory plan of the chart's GPU examples (bf16, activation checkpointing, prompts up to
    2048 tokens), computed: a markdown table for docs/learner.md."""
    import yaml

    from magic.learner import memory

    ci = ROOT / "charts" / "magic" / "ci"
    gib = memory.GiB
    keys = ["weights", "gradients", "optimizer", "zero_buffers", "gathered", "activations", "logits", "optimizer_step", "publish", "runtime"]
    print("| model, learner | T | " + " | ".join(keys) + " | peak per GPU (GiB) | fits an 80 GB GPU (67.1 GiB usable) |")
    print("|" + " --- |" * (len(keys) + 4))
    for name, values in (("DeepSeek-R1-Distill-Qwen-7B", "gpu-7b-values.yaml"), ("DeepSeek-R1-Distill-Qwen-32B", "gpu-32b-values.yaml")):
        model = memory.ModelShape.from_path(ci / "models" / name)
        vals = yaml.safe_load((ci / values).read_text())
        for T in (16384, 32768):
            shape = memory.shape_from_values(vals, sequence_tokens=T + memory.DEFAULT_PROMPT_TOKENS)
            p = memory.plan(model, shape)
            c = p.per_rank
            fix = "" if p.fits else " — " + p.problems[0].split(": ", 1)[1]
            learner = f"{model.params / 1e9:.1f}B, {shape.gpus}×{shape.nodes} ZeRO-{shape.zero_stage}"
            print(f"| {learner} | {T // 1024}k | " + " | ".join(f"{c[k] / gib:.1f}" if k in c else "–" for k in keys)
                  + f" | **{p.rank_total / gib:.1f}** | {'yes' if p.fits else 'no' + fix} |")


def main() -> None:
    if sys.argv[1:2] == ["--rank"]:
        a = sys.argv[2:]
        return rank_main(a[0], a[1], int(a[2]), a[3], a[4] == "1", int(a[5]))
    if sys.argv[1:2] == ["--calibrate-one"]:
        a = sys.argv[2:]
        return calibrate_one(int(a[0]), int(a[1]), a[2], a[3] == "1", int(a[4]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", type=Path, default=Path("/tmp/magic-bench-qwen2-0.51b"))
    ap.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, help="W:ZeRO:precision:checkpointing(0/1):tokens per micro-batch")
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--gpu-table", action="store_true", help="print docs/learner.md's table: the plan of the chart's 7B and 32B examples at T = 16k and 32k (computed)")
    ap.add_argument("--phases", action="store_true", help="print each rank's resident memory after each phase")
    ap.add_argument("--calibrate-tokens", type=int, default=2048)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--measured", type=Path, help="compare the plan with the measurements a previous --json run saved (no ranks are run)")
    args = ap.parse_args()
    if args.calibrate:
        return calibrate(args)
    if args.gpu_table:
        return gpu_table()
    from magic.learner import memory

    args.model_dir.mkdir(parents=True, exist_ok=True)
    if not args.measured:
        build_model(args.model_dir)
    elif not (args.model_dir / "config.json").exists():  # the plan reads only the model's config.json
        from transformers import Qwen2Config

        Qwen2Config(**MODEL).save_pretrained(args.model_dir)
    work = args.model_dir / "runs"
    work.mkdir(exist_ok=True)
    gib = memory.GiB
    rows, worst = [], 0.0
    print(f"{'shape (W:ZeRO:precision:ckpt:N)':<34} {'predicted':>10} {'measured':>10} {'error':>7}   components predicted (GiB)")
    saved = {row["spec"]: row for row in json.loads(args.measured.read_text())} if args.measured else {}
    for spec in (list(saved) if saved else args.shapes):
        r = saved[spec] if saved else run_shape(args.model_dir, spec, work)
        pred = predict(args.model_dir, r)
        total = memory.peak_bytes(pred)
        measured = max(x["train_peak"] for x in r["ranks"])
        err = (total - measured) / measured
        worst = max(worst, abs(err))
        comps = ", ".join(f"{k} {v / gib:.2f}" for k, v in pred.items())
        print(f"{spec:<34} {total / gib:9.2f}G {measured / gib:9.2f}G {err:+7.1%}   {comps}", flush=True)
        pub = r["ranks"][0]
        print(f"{'':<34} publish: rank 0 +{pub['publish_extra'] / gib:.2f} GiB over {pub['published'] / gib:.2f} GiB published in buckets of "
              f"{__import__('magic.learner.backends', fromlist=['x']).PUBLISH_BUCKET_BYTES / gib:.2f} GiB; runtime measured {min(x['runtime'] for x in r['ranks']) / gib:.2f} GiB; "
              f"step {max(x['step_seconds'] for x in r['ranks']):.0f} s; {r['seconds']:.0f} s in all", flush=True)
        if args.phases:
            for x in r["ranks"]:
                print(f"{'':<34} rank {x['rank']} resident after: " + ", ".join(f"{k} {v / gib:.2f}" for k, v in x["phases"].items()), flush=True)
        rows.append(dict(r, predicted=pred, predicted_total=total, measured=measured, error=err))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(f"largest error {worst:.1%} (tolerance {args.tolerance:.0%})")
    if worst > args.tolerance:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
