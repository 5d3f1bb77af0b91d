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


def test_magic_local_runs_two_stages_and_writes_metrics_and_plot(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "magic.cli", "local", "--out", str(out), "--demo-dir", str(tmp_path / "demo"),
         "--sft-steps", "20", "--stage1-steps", "2", "--stage2-steps", "2", "--T1", "16", "--T2", "32",
         "--rollout-batch-size", "4", "--group-size", "4", "--eval-prompts", "8", "--eval-samples", "2", "--timeout", "300"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "held-out accuracy:" in proc.stdout and "step   3 [stage2 T=32]" in proc.stdout
    assert "warm start" in proc.stdout  # the progress bar
    tail = proc.stdout[proc.stdout.index("next:"):]
    assert str(out / "summary.json") in tail and str(out / "run.png") in tail and "magic local --steps" in tail
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["version_mismatches"] == 0 and summary["stages"] == ["stage1", "stage2"]
    assert 0 <= summary["heldout_accuracy_before"] <= 1 and 0 <= summary["heldout_accuracy_after"] <= 1
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
