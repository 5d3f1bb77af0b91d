"""Learner ranks find a dead or hung peer in about the collective timeout, while waiting for rank
0's next command is unbounded (`worker._next_command` waits on the launcher's store, not in a
collective): so the timeout can be minutes (`collective_timeout_seconds`, 30 by default) instead
of the week it had to be when followers waited in a broadcast."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

from ranks import start_ranks

SCRIPT = Path(__file__).with_name("collective_ranks.py")


def test_followers_wait_for_rank_0_longer_than_the_collective_timeout():
    procs = start_ranks(SCRIPT, 2, "idle")
    logs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(x[-3000:] for x in logs)
    waited = float(re.search(r"follower got \('stop',\) after ([\d.]+) s", logs[1]).group(1))
    assert waited > 6.0  # 3x the 3 s collective timeout, minus start-up skew


def test_a_rank_stuck_with_a_hung_peer_fails_within_the_timeout():
    procs = start_ranks(SCRIPT, 2, "stuck")
    try:
        t0 = time.monotonic()
        out = procs[0].communicate(timeout=90)[0]
        elapsed = time.monotonic() - t0
    finally:
        os.kill(procs[1].pid, signal.SIGKILL)
        procs[1].communicate()
    assert procs[0].returncode == 3, out[-3000:]
    failed_after = float(re.search(r"all_reduce failed after ([\d.]+) s", out).group(1))
    assert failed_after < 30 and elapsed < 90
