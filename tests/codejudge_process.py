"""The code judge as its own process (`python -m magic.codejudge`), for the tests that score code
through it: started with a private sandbox root and uid range, ready once its sandbox passed its
self-check."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from waiting import answers, wait_for

TOKEN = "codejudge-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@contextmanager
def code_judge(log_dir: Path, uid_base: int, root: str = "/tmp/magic-sandbox-test", **sandbox):
    """Start a code judge; yields (its base URL, its metrics URL, the Supervisor running it as
    ``codejudge``)."""
    from magic.runtime.ports import free_port
    from magic.local.supervisor import Supervisor

    port, metrics = free_port(), free_port()
    settings = dict(root=root, uid_base=uid_base, uid_count=50, slots=1, test_timeout_seconds=2, memory_mb=256, processes=8) | sandbox
    env = {
        "MAGIC_JUDGE_PORT": str(port),
        "MAGIC_METRICS_PORT": str(metrics),
        "MAGIC_API_TOKEN": TOKEN,
        **{f"MAGIC_SANDBOX__{k.upper()}": str(v) for k, v in settings.items()},
    }
    sup = Supervisor(log_dir, env)
    sup.start("codejudge", "magic.codejudge")
    try:
        wait_for(lambda: answers(f"http://127.0.0.1:{metrics}/readyz"), 60, "the code judge's /readyz", sup=sup)
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics}", sup
    finally:
        sup.stop_all()
