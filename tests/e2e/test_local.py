"""`magic local` (the README's run command) end to end, with a short warm start and short stages."""

import json
import subprocess
import sys

import pytest

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
