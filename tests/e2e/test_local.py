"""`magic local` (the README's run command) end to end, with a short warm start and short stages."""

import json
import subprocess
import sys

import pytest
from waiting import alive

pytestmark = pytest.mark.e2e


def test_a_bad_stage_plan_is_refused_before_the_warm_start(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text('[{"name": "a", "steps": 2, "T": 8}, {"name": "b", "steps": 0, "T": 8}]')
    proc = subprocess.run(
        [sys.executable, "-m", "magic.cli", "local", "--stages", str(plan), "--demo-dir", str(tmp_path / "demo"), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2 and "steps" in proc.stderr and "invalid stage plan" in proc.stderr
    assert not (tmp_path / "demo").exists()


ARGS = ["--sft-steps", "20", "--stage1-steps", "2", "--stage2-steps", "2", "--T1", "16", "--T2", "32",
        "--rollout-batch-size", "4", "--group-size", "4", "--eval-prompts", "8", "--eval-samples", "2", "--timeout", "300"]


def _local(out, demo, *extra) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "magic.cli", "local", "--out", str(out), "--demo-dir", str(demo), *ARGS, *extra],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


TIMING = ("seconds", "per_second", "per_hour", "_at", "time")


def _training_figures(record: dict) -> dict:
    """A step record's training figures: everything but wall times and validation."""
    return {k: v for k, v in record.items() if k != "validation" and not any(t in k for t in TIMING)}


@pytest.fixture(scope="module")
def validated_run(tmp_path_factory):
    """The short run with in-run validation every 2 steps on 4 held-out prompts."""
    tmp = tmp_path_factory.mktemp("local")
    return tmp, _local(tmp / "out", tmp / "demo", "--val-every", "2", "--val-prompts", "4")


def test_magic_local_runs_two_stages_and_writes_metrics_and_plot(validated_run):
    tmp_path, proc = validated_run
    out = tmp_path / "out"
    assert "held-out accuracy:" in proc.stdout and "step   3 [stage2 T=32]" in proc.stdout
    # not a terminal: no progress bar (no \r fragments), a plain line every 100 warm-start steps, no library chatter
    log = proc.stdout + proc.stderr
    assert "\r" not in log and "warm start step 20/20" in log
    assert "fontManager" not in log and "Loading weights" not in log
    tail = proc.stdout[proc.stdout.index("next:"):]
    assert str(out / "summary.json") in tail and str(out / "run.png") in tail and "magic local --steps" in tail
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4] and [r.get("final") for r in records] == [None] * 4 + [True]  # the final validation last
    summary = json.loads((out / "summary.json").read_text())
    assert summary["version_mismatches"] == 0 and summary["stages"] == ["stage1", "stage2"]
    assert 0 <= summary["heldout_accuracy_before"] <= 1 and 0 <= summary["heldout_accuracy_after"] <= 1
    assert summary["heldout_before"]["avg_at_n"] == summary["heldout_accuracy_before"] and summary["heldout_before"]["prompts"] == 8
    # in-run validation of versions 0, 2 and the final 4: in the step records and the summary
    assert sorted(summary["validation"]) == ["0", "2", "4"]
    for v in ("0", "2", "4"):
        f = summary["validation"][v]
        assert (f["prompts"], f["samples"]) == (4, 2) and 0 <= f["avg_at_n"] <= 1
    assert [r["step"] for r in records if "validation" in r] == [0, 2, 4]
    assert records[2]["validation"]["chain-sum-heldout"] == summary["validation"]["2"]
    assert records[4]["validation"]["chain-sum-heldout"] == summary["validation"]["4"]
    # the plan's end is checkpointed: the policy after 4 steps, found by the export hint
    assert (out / "data" / "runs" / "local" / "checkpoints" / "step-00000004" / "COMPLETE").exists() and " export local " in tail
    # each validation's generations (the first prompts' samples), the best one named and its checkpoint kept
    generations = out / "data" / "runs" / "local" / "generations"
    assert sorted(p.name for p in generations.iterdir()) == ["step-00000000.jsonl", "step-00000002.jsonl", "step-00000004.jsonl"]
    rows = [json.loads(x) for x in (generations / "step-00000004.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * 2 and all(r["response"] and r["policy_version"] == 4 for r in rows) and f"head -n 2 {generations / 'step-00000004.jsonl'}" in tail
    best = summary["best"]
    assert best["by"] == "avg_at_n" and best["value"] == max(summary["validation"][v]["avg_at_n"] for v in ("0", "2", "4"))
    assert best["checkpoint"] is None or (out / "data" / "runs" / "local" / "checkpoints" / best["checkpoint"] / "COMPLETE").exists()
    png = (out / "run.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc: parent links)."""
    from pathlib import Path

    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_nothing_outlives_a_killed_magic_local(tmp_path, sig):
    """`magic local` stopped by SIGTERM (a `kill`, a CI timeout) stops its services and its Redis
    as Ctrl-C does; even SIGKILLed, it leaves no process behind (each child dies with it)."""
    import signal
    import time

    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "magic.cli", "local", "--out", str(out), "--demo-dir", str(tmp_path / "demo"), "--sft-steps", "5",
         "--steps", "50", "--rollout-batch-size", "4", "--group-size", "4", "--no-eval", "--timeout", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        seen = ""
        while "[4/5] training" not in seen:  # every service is up and the run has started
            line = proc.stdout.readline()
            assert line, f"magic local ended before training: {seen[-3000:]}"
            seen += line
        family = _descendants(proc.pid)
        assert len(family) >= 5  # redis-server and the four services, at least
        proc.send_signal(getattr(signal, sig))
        proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while (left := {p for p in family if alive(p)}) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"still running after {sig}: {[open(f'/proc/{p}/cmdline').read().replace(chr(0), ' ')[:120] for p in left if alive(p)]}"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_in_run_validation_leaves_the_training_figures_as_they_are(validated_run):
    """The same run without validation trains on the same samples: every training figure of
    every step is equal (validation groups have their own seeds and run between steps)."""
    tmp_path, _ = validated_run
    _local(tmp_path / "plain", tmp_path / "demo", "--val-every", "0")
    with_val = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    without = [json.loads(x) for x in (tmp_path / "plain" / "metrics.jsonl").read_text().splitlines()]
    assert json.loads((tmp_path / "plain" / "summary.json").read_text())["validation"] == {}
    assert len(with_val) == 5 and with_val[-1]["final"] and len(without) == 4
    for a, b in zip(with_val[:4], without):
        assert {"reward_mean", "loss", "grad_norm", "entropy_coef", "response_length_mean"} <= _training_figures(a).keys() and a["response_length_mean"] > 0
        assert _training_figures(a) == _training_figures(b), a["step"]
