"""The learner job as the chart renders it, run here: the rendered learner container (command, args,
env, mounts) of every pod, started as CPU processes (gloo) against a real Redis, trains two steps
and agrees with one process. Shapes: one rank (`magic serve learner`), gpus 2 x nodes 1 (torchrun
--standalone) and gpus 1 x nodes 2 (two pods, torchrun's c10d rendezvous on the first pod's
name, mapped to 127.0.0.1). Every pod's /livez and /readyz answer on its metrics port."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import learner_batches
import pytest
from learner_batches import publish_step, scored_groups, stage

from magic import modeling
from magic.config.schema import RunSpec
from magic.protocol import keys
from magic.protocol.pb import messages_pb2 as pb
from magic.runtime.ports import free_port
from magic.store import acl
from magic.store.streams import Stream

from .conftest import NAMESPACE, RELEASE, ROOT
from .pods import container_process

pytestmark = pytest.mark.integration

LEARNER = f"{RELEASE}-magic-learner"
STEPS = 2


def render_learner(chart, redis_url: str, gpus: int, nodes: int) -> tuple[list[dict], dict]:
    import yaml

    values = {
        "redis": {"enabled": False},
        "externalRedis": {"url": redis_url},
        "learner": {
            "gpus": gpus, "nodes": nodes, "zeroStage": 3, "rendezvousPort": free_port(),
            # float32 as the one-process reference (GPU pods default to bf16), tiny micro-batches
            "precision": "fp32", "microBatchTokens": 64,
            # the demo-sized learner: a checkpoint every step, one thread per rank
            "extraEnv": [{"name": "MAGIC_LOGPROB_CHUNK_SIZE", "value": "5"},
                         {"name": "MAGIC_CHECKPOINT_EVERY", "value": "1"}, {"name": "MAGIC_TORCH_THREADS", "value": "1"}],
        },
    }
    out = chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = [d for path, text in out.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    sts = next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == LEARNER)
    return docs, sts


@pytest.mark.parametrize("gpus, nodes", [(1, 1), (2, 1), (1, 2)], ids=["one-rank", "gpus2-nodes1", "gpus1-nodes2"])
def test_the_rendered_learner_job_trains_like_one_process(chart, r, redis_server, tiny_model_dir, tmp_path, gpus, nodes):
    # every rank reaches Redis as the learner's ACL user, as the chart deploys it (the test itself is the controller)
    learner_url = acl.create_users_at(redis_server.url, {role: f"{role}-pw-0123" for role in acl.ROLES})["learner"]
    r.acl_log_reset()
    docs, sts = render_learner(chart, learner_url, gpus, nodes)
    assert sts["spec"]["replicas"] == nodes
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert (container.get("command") == ["torchrun"]) == (gpus * nodes > 1)

    run_id = f"shape-{gpus}x{nodes}"
    spec = RunSpec(name=run_id, model=str(tiny_model_dir), train_files=["unused.jsonl"], stages=[stage(steps=STEPS)])
    k = keys.RunKeys(run_id)
    r.set(k.spec, spec.model_dump_json())
    vocab = modeling.load_model_config(tiny_model_dir).vocab_size
    for step in range(STEPS):
        publish_step(r, run_id, step, spec.stages[0], scored_groups(step, 4, 4, vocab, seed=3))

    data = tmp_path / "data"  # the ReadWriteMany volume: one directory for every pod
    pods = []
    for i in range(nodes):
        pod_dir = tmp_path / f"pod-{i}"
        volumes = {"data": data, "tmp": pod_dir / "tmp", "home": pod_dir / "home", "shm": pod_dir / "shm"}
        for d in volumes.values():
            d.mkdir(parents=True, exist_ok=True)
        metrics_port = free_port()  # every pod has its own IP there, and one address here
        argv, env = container_process(
            docs, sts["spec"]["template"], f"{LEARNER}-{i}", "learner", ROOT / "docker" / "learner.Dockerfile", volumes,
            hosts={f"{LEARNER}-0.{LEARNER}": "127.0.0.1"},
            node_env={"MAGIC_DEVICE": "cpu", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "MAGIC_METRICS_PORT": str(metrics_port)},
        )
        base = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "LANG")}
        log = (pod_dir / "log").open("w")
        proc = subprocess.Popen(argv, env=base | env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        pods.append((proc, metrics_port, pod_dir / "log"))

    def tails(tail: int | None = 3000) -> str:
        """Every pod's log: its last `tail` characters (a failure message), or all of it (None)."""
        return "\n".join(f"--- pod {i}\n{Path(p[2]).read_text()[-tail if tail else 0:]}" for i, p in enumerate(pods))

    try:
        r.set(keys.ACTIVE_RUN, run_id)
        deadline = time.monotonic() + 240
        done: list = []
        while time.monotonic() < deadline and len(done) < STEPS:
            assert all(p.poll() is None for p, _, _ in pods), tails()
            done = [e.step_completed for _, e in Stream(r, k.events_of("learner")).read_after("0", pb.Event) if e.WhichOneof("kind") == "step_completed"]
            time.sleep(0.2)
        assert len(done) == STEPS, f"the learner job did not train {STEPS} steps\n{tails()}"
        assert not [e for e in r.acl_log() if e["username"] == "magic-learner"], "a rank was refused by the learner's ACL"
        for _, port, _ in pods:  # every pod answers its probes, the followers' pods included
            assert httpx.get(f"http://127.0.0.1:{port}/livez", timeout=5).status_code == 200, tails()
            assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200, tails()
        r.delete(keys.ACTIVE_RUN)  # the run ends: rank 0 detaches (and tells the other ranks)
        time.sleep(1.5)
        for proc, _, _ in pods:  # the kubelet's SIGTERM to each container's first process
            proc.send_signal(signal.SIGTERM)
        for proc, _, _ in pods:
            proc.wait(60)
    finally:
        for proc, _, _ in pods:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    logs = tails(None)  # whole: torchrun's agents may end with C++ stack traces longer than a tail
    assert f"learner {LEARNER}-" in logs and logs.count(" stopped") >= gpus * nodes, logs  # every rank stopped cleanly on SIGTERM
    if gpus * nodes > 1:  # every other rank followed rank 0 and stopped with it; torchrun's agent
        # itself ends a SIGTERM with its SignalException (its documented behaviour), nothing else fails
        assert sorted(int(line.split("rank ")[1].split()[0]) for line in logs.splitlines() if "stopped with rank 0" in line) == list(range(1, gpus * nodes)), logs
        assert logs.count("Traceback") == logs.count("SignalException: Process") == nodes, logs
    else:
        assert "Traceback" not in logs and pods[0][0].returncode == 0, logs
    ref_records, _ = learner_batches.single_process(tiny_model_dir, STEPS)
    for a, b in zip(ref_records, done, strict=True):
        for key in learner_batches.RECORD_KEYS:
            assert b.metrics[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (key, tails())
    assert (data / "runs" / run_id / "checkpoints" / "step-00000002" / "COMPLETE").exists()
