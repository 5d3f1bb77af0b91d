"""The code sandbox in an unprivileged user namespace, as a reward pod with `hostUsers: false` runs
it: the service is root and holds SYS_ADMIN only inside the namespace (its root is host uid
100000), bubblewrap makes its namespaces there, and programs are judged as everywhere else —
while the namespace's root cannot touch a file of the host's root.

The namespace is made by the test itself (tests/integration/userns.py: root on the host writes its
uid and gid maps). Its processes cannot enter root's home, where this machine's Python lives, so the
sandbox runs from Debian's /usr/bin/python3.11 in a virtualenv the test makes, world-readable, with
the few packages the sandbox imports, and the project's sources on PYTHONPATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"
HOST_BASE = 100000
PACKAGES = ["pydantic", "pydantic-settings", "pyseccomp", "redis", "protobuf"]

JUDGE = r"""
import json, os
from magic.codejudge.sandbox import confine
from magic.codejudge.verifier import CodeVerifier
from magic.codejudge.sandbox.runner import Sandbox
from magic.codejudge.settings import SandboxSettings
print("inside: uid", os.getuid(), "map", " ".join(open("/proc/self/uid_map").read().split()), "bwrap", confine.bwrap_works())
try:
    open(os.environ["HOST_ROOT_FILE"]).read()
except OSError as exc:
    print("host root's file:", type(exc).__name__)
truth = json.dumps({"type": "stdin_stdout", "inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]})
fence = lambda code: code + "\n"  # the program as the judge receives it
with Sandbox(SandboxSettings(slots=1, root=os.environ["SANDBOX_ROOT"], uid_base=1000, test_timeout_seconds=10, total_timeout_seconds=60)) as box:
    judge = CodeVerifier(box)
    print("correct:", judge.verify(fence("a, b = map(int, input().split())\nprint(a + b)"), truth).status.value)
    print("wrong:", judge.verify(fence("print(3)"), truth).status.value)
    escape = judge.verify(fence("import os\na, b = map(int, input().split())\ntry:\n    os.setuid(0)\n    print(a + b)\nexcept OSError:\n    print(0)"), truth)
    print("setuid:", escape.status.value, escape.details[:80])
"""


@pytest.fixture(scope="module")
def world_readable_python():
    if os.geteuid() != 0:
        pytest.skip("making a user namespace's maps for another range of uids takes root (make test runs as root in CI)")
    if not (Path(SYSTEM_PYTHON).exists() and shutil.which("bwrap")):
        pytest.fail(f"this test needs {SYSTEM_PYTHON} (Debian's, with python3-venv) and bubblewrap: make test installs them")
    home = Path(tempfile.mkdtemp(prefix="magic-userns-", dir="/tmp"))
    try:
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(home / "venv")], check=True, capture_output=True)
        subprocess.run([str(home / "venv" / "bin" / "pip"), "install", "--quiet", "-c", str(ROOT / "docker" / "constraints.txt"), *PACKAGES], check=True, capture_output=True)
        for d in (home, *home.rglob("*")):
            d.chmod(d.stat().st_mode | 0o005 | (0o001 if d.is_dir() else 0))
        (home / "sandbox").mkdir()
        os.chown(home / "sandbox", HOST_BASE, HOST_BASE)  # the namespace's root owns the sandbox's own directory
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_the_sandbox_judges_in_an_unprivileged_user_namespace(world_readable_python, tmp_path):
    home = world_readable_python
    private = Path(tempfile.mkdtemp(prefix="magic-host-root-"))  # mode 0700, the host root's
    secret = private / "secret"
    secret.write_text("host root's")
    try:
        env = {
            "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "services"), "SANDBOX_ROOT": str(home / "sandbox" / "root"),
            "PIP_CONFIG_FILE": os.devnull, "HOST_ROOT_FILE": str(secret),
        }
        done = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "integration" / "userns.py"), str(HOST_BASE), str(home / "venv" / "bin" / "python"), "-c", JUDGE],
            capture_output=True, text=True, timeout=120, env=env, check=False,
        )
    finally:
        shutil.rmtree(private, ignore_errors=True)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert f"inside: uid 0 map 0 {HOST_BASE} 65536 bwrap None" in out, out  # root in the namespace only; bubblewrap works there
    assert "host root's file: PermissionError" in out, out  # the namespace's root is no root of the host
    assert "correct: correct" in out and "wrong: wrong" in out, out
    assert "setuid: wrong" in out, out  # a program cannot become the namespace's root either
