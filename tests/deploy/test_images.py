"""The images are built and checked here, not only described: `docker/check_images.py` (what `make
images` runs) builds the controller and reward images exactly from docker/ with podman on a Debian
bookworm base made here, checks them from the inside (entry point, imports, no torch, user 10001,
writable paths, the reward's sandbox judging real programs), builds the GPU images' wheel stage,
and must catch a broken Dockerfile (a wrong COPY path, a missing entry point)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.deploy


def test_the_cpu_images_build_from_docker_and_pass_their_checks_and_broken_ones_fail(tmp_path):
    log = tmp_path / "images.log"
    done = subprocess.run(
        [sys.executable, str(ROOT / "docker" / "check_images.py"), "--gpu-wheels", "--broken", "--log", str(log)],
        capture_output=True, text=True, timeout=1500, check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{out}\n--- log tail\n{log.read_text()[-4000:] if log.exists() else ''}"
    for line in (
        "ok    controller: build from docker/controller.Dockerfile", "ok    controller: checks inside the image (as its user)",
        "ok    reward: build from docker/reward.Dockerfile", "ok    reward: checks inside the image (as its user)",
        "ok    reward: checks inside the image (as root, privileged)",
        "ok    rollout: the wheel holds the package and its entry point", "ok    learner: the wheel holds the package and its entry point",
        "ok    a Dockerfile with a wrong COPY path is caught", "ok    a Dockerfile with a missing entry point is caught",
    ):
        assert line in out, out
    inside = log.read_text()
    for line in ("ok    torch is absent", "ok    runs as 10001:10001", "ok    /home/magic is writable by the service user",
                 "ok    the seccomp filters compile (libseccomp)"):
        assert inside.count(line) >= 2 or (line.startswith("ok    the seccomp") and line in inside), line
    # the reward image's sandbox judged real programs, or said exactly why it could not in a build step
    assert "ok    the sandbox judges: a correct program correct, a wrong one wrong" in inside or "note  the sandbox's self-test cannot run" in inside
