"""Redis memory stays flat across steps: the paper-scale simulation at a small shape.

`benchmarks/paper_scale.py` runs the real controller (with stream retention), Redis, reward
service and the rollout/learner service loops with stand-in generation and training. Over 12
steps each step stores ≈ 2 MB of rollouts and scores in Redis; without retention Redis would grow
by that much every step. The test asserts that its peak does not grow, that the streams hold at
most the step in flight, and that no group was lost or dead-lettered.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "paper_scale.py"
GROUPS, GS, STEPS = 8, 4, 12


def test_redis_memory_stays_flat_across_steps(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--groups", str(GROUPS), "--group-size", str(GS), "--max-tokens", "4096", "--steps", str(STEPS),
         "--generation-seconds", "0.5", "--train-seconds", "0.05", "--reward-processes", "1", "--maxmemory", "256mb",
         "--workdir", str(tmp_path / "work"), "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fig = json.loads(out.read_text())
    steps = fig["steps"]
    assert [s["step"] for s in steps] == list(range(STEPS))
    assert fig["lost_steps"] == [] and fig["dead_letters"] == 0 and fig["version_mismatch"] == 0
    assert all(s["samples"] == GROUPS * GS for s in steps)

    per_step = min(s["bytes_through_redis"] for s in steps)
    assert per_step > 1_000_000  # each step really moved its payload through Redis (≈ 5 times: in, out, scored in, out twice)
    # flat: Redis' peak over the last steps is that of the first ones (one step in flight);
    # without retention it would grow by a step's rollouts + scores (≈ 2/5 of per_step) every step
    early = max(s["redis_peak_bytes"] for s in steps[1:6])
    late = max(s["redis_peak_bytes"] for s in steps[7:])
    assert late - early < per_step / 4, (early, late, per_step)
    for s in steps:
        streams = s["streams"]
        assert streams["rollouts"] <= GROUPS and streams["prompts"] <= GROUPS and streams["scored"] <= 2 * GROUPS, streams
        assert streams["weights"] <= 3 and streams["events"] <= 4, streams
