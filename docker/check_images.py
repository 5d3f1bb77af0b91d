"""Build the CPU images from docker/ and check them from the inside, without a container runtime.

    python docker/check_images.py                       controller and reward on a Debian base made here
    python docker/check_images.py --base IMAGE          ... on another base (the pinned python:3.11 by default in CI)
    python docker/check_images.py --broken              also: a broken Dockerfile must fail the check
    python docker/check_images.py --engine docker --no-build --image controller=ghcr.io/...:tag
                                                        check images built elsewhere (the images workflow)

What `make images` runs. Each image is built exactly from its Dockerfile (`podman build --isolation
chroot`, or `docker build`), with only its base image replaced (`--build-arg PYTHON_IMAGE=...`): a
Debian bookworm root made by `mmdebstrap` from Debian's packages (its python3 is 3.11, the images'
minor), since the official python image cannot be pulled here. Nothing can `run` an image on this
machine (podman's runtime needs CAP_SYS_RESOURCE), so every check runs as a build step of a stage
`FROM` the built image, as its user, with its entry point:

    the entry point starts          ENTRYPOINT --version prints the package's version; `serve --help`
    the image's metadata            user 10001:10001, ENTRYPOINT ["magic"], CMD ["serve", <service>] (the chart's)
    the service's imports           every module the service loads at start
    no torch                        the CPU images never carry torch
    files as the chart expects      /home/magic and /tmp writable by 10001 (the chart mounts both), the venv not
    (reward) the code sandbox       bubblewrap and the seccomp filters present; as root (the chart runs it
                                    so), a correct and a wrong program judged in the real sandbox — or the
                                    exact reason bubblewrap cannot start inside a build step

The GPU images (rollout, learner) start from vLLM's CUDA image, which cannot be pulled or run
here: their `wheel` stage is built from its Dockerfile and the wheel's contents checked (docs/limits.md
lists the rest). Exit status 0 only if every build and check passed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEBIAN_BASE = "localhost/magic-debian-base:bookworm-py311-2"  # the suffix changes with DEBIAN_PACKAGES
DEBIAN_PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "passwd", "ca-certificates")
"""What the stand-in base has (the official python:3.11-slim image's equivalent: python, pip, venv, useradd)."""
MODULES = {
    "controller": ["magic.cli", "magic.controller.app", "magic.controller.driver", "magic.store.acl"],
    "reward": ["magic.cli", "magic.reward.worker", "magic.reward.math.verifier", "magic.codejudge.service", "magic.codejudge.sandbox.runner"],
    "rollout": ["magic.cli", "magic.rollout.worker", "magic.rollout.vllm_engine", "magic.rollout.vllm_ext"],
    "learner": ["magic.cli", "magic.learner.worker", "magic.learner.backends"],
}
"""The modules each service loads at start."""
TORCH = {"controller": "absent", "reward": "absent", "rollout": "present", "learner": "present"}
"""The CPU images never carry torch; the GPU images carry vLLM's."""
GPU_WHEEL_FILES = ["magic/cli.py", "magic/rollout/vllm_ext.py", "magic/learner/worker.py", "magic/protocol/pb/messages_pb2.py"]

INSIDE = r'''
import importlib, importlib.util, os, sys
from importlib.metadata import version
service, expected, modules, torch = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4]
failed = []
def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failed.append(what)
check(os.getuid() == 10001 and os.getgid() == 10001, f"runs as 10001:10001 (uid {os.getuid()}, gid {os.getgid()})")
check(version("magic-rl") == expected, f"magic-rl {version('magic-rl')} installed (pyproject.toml: {expected})")
for name in modules:
    try:
        importlib.import_module(name)
        check(True, f"import {name}")
    except Exception as exc:
        check(False, f"import {name}: {type(exc).__name__}: {exc}")
check((importlib.util.find_spec("torch") is None) == (torch == "absent"), f"torch is {torch}")
for path in ("/home/magic", "/tmp"):
    probe = os.path.join(path, ".magic-probe")
    try:
        open(probe, "w").close(); os.remove(probe); ok = True
    except OSError:
        ok = False
    check(ok, f"{path} is writable by the service user")
check(not os.access(sys.prefix, os.W_OK), f"{sys.prefix} (the venv) is not writable by the service user")
sys.exit(1 if failed else 0)
'''

SANDBOX = r'''
import json, sys
from magic.codejudge.sandbox import confine
failed = []
def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failed.append(what)
check(confine.bwrap_path() is not None, f"bubblewrap is installed ({confine.bwrap_path()})")
try:
    confine.seccomp_bpf(); confine.program_seccomp_bpf()
    check(True, "the seccomp filters compile (libseccomp)")
except Exception as exc:
    check(False, f"the seccomp filters: {type(exc).__name__}: {exc}")
why = confine.bwrap_works() if not failed else "see above"
if why is None:
    from magic.codejudge.verifier import CodeVerifier
    from magic.codejudge.sandbox.runner import Sandbox
    from magic.codejudge.settings import SandboxSettings
    truth = json.dumps({"type": "stdin_stdout", "inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]})
    with Sandbox(SandboxSettings(slots=1, root="/tmp/magic-sandbox", test_timeout_seconds=10, total_timeout_seconds=60)) as box:
        judge = CodeVerifier(box)
        right = judge.verify("a, b = map(int, input().split())\nprint(a + b)\n", truth)
        wrong = judge.verify("print(3)\n", truth)
    check(right.status.value == "correct" and wrong.status.value == "wrong", f"the sandbox judges: a correct program {right.status.value}, a wrong one {wrong.status.value}")
elif not failed and sys.argv[1:] == ["--require"]:
    check(False, f"bubblewrap cannot start a confined process with the code judge pod's privileges: {why}")
elif not failed:
    print(f"note  the sandbox's self-test cannot run in a build step: bubblewrap cannot start a confined process here: {why}", flush=True)
sys.exit(1 if failed else 0)
'''


class Engine:
    def __init__(self, name: str, log: Path, ca_bundle: Path | None = None, work: Path | None = None):
        self.name = name
        self.log = log
        self.mounts: list[str] = []
        """Bind mounts of every RUN step (podman), never part of an image: the host's CA bundle and a
        pip.conf naming it, where TLS goes through a proxy that re-signs it (as on the machine this
        was written on): pip and apt inside the build then trust what the host trusts."""
        if ca_bundle is not None and name == "podman":
            conf = work / "pip.conf"
            conf.write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
            self.mounts = [f"{ca_bundle}:/etc/ssl/certs/ca-certificates.crt:ro", f"{conf}:/etc/pip.conf:ro"]

    def run(self, argv: list[str], what: str, check: bool = True) -> subprocess.CompletedProcess:
        t0 = time.monotonic()
        with self.log.open("a") as f:
            f.write(f"\n$ {' '.join(argv)}\n")
            f.flush()
            done = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, check=False)
        print(f"{'ok  ' if done.returncode == 0 else 'FAIL'}  {what} ({time.monotonic() - t0:.0f} s)", flush=True)
        if check and done.returncode != 0:
            raise Failed(f"{what}: exit {done.returncode} (log: {self.log})")
        return done

    def build(
        self, dockerfile: Path, tag: str, what: str, build_args: dict[str, str], target: str | None = None, check: bool = True, privileged: bool = False,
        no_cache: bool = False,
    ) -> bool:
        argv = [self.name, "build", "-f", str(dockerfile), "-t", tag, *(["--no-cache"] if no_cache else [])]
        if self.name == "podman":
            argv += ["--isolation", "chroot"]
            if privileged:  # what the chart gives the reward pod for the sandbox: root, SYS_ADMIN, no seccomp/AppArmor profile
                argv += ["--cap-add", "ALL", "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined"]
            for mount in self.mounts:
                argv += ["--volume", mount]
        for k, v in build_args.items():
            argv += ["--build-arg", f"{k}={v}"]
        if target:
            argv += ["--target", target]
        return self.run([*argv, str(ROOT)], what, check).returncode == 0

    def check_inside(self, image: str, steps: list[tuple[str, list[str]]], checkfile: Path, what: str) -> bool:
        """Run each step's command in `image`, as its user or as root: podman, which cannot run an
        image here, as build steps of a stage FROM it; docker as containers (`docker run`; the
        root steps privileged, as the chart runs the reward pod with the code sandbox)."""
        if self.name == "podman":
            ok = True
            for who in ("user", "root"):
                runs = [f"RUN {json.dumps(argv)}" for w, argv in steps if w == who]
                if runs:
                    lines = [f"FROM {image}", *(["USER 0"] if who == "root" else []), *runs]
                    checkfile.write_text("\n".join(lines) + "\n")
                    ok &= self.build(
                        checkfile, f"{image}-checked-{who}", f"{what} (as {'root, privileged' if who == 'root' else 'its user'})", {}, check=False,
                        privileged=who == "root", no_cache=True,  # the checks run every time, never from the layer cache
                    )
            return ok
        ok = True
        for who, argv in steps:
            run = [self.name, "run", "--rm", "--entrypoint", argv[0]]
            if who == "root":
                run += ["--user", "0", "--privileged"]
            ok &= self.run([*run, image, *argv[1:]], f"{what}: {' '.join(argv[:2])[:60]}", check=False).returncode == 0
        return ok

    def inspect(self, image: str) -> dict:
        out = subprocess.run([self.name, "image", "inspect", image], capture_output=True, text=True, check=True).stdout
        return json.loads(out)[0]["Config"]


class Failed(Exception):
    pass


def debian_base(engine: Engine, work: Path) -> str:
    """The stand-in for python:3.11-slim-bookworm, made once from Debian's packages."""
    if subprocess.run([engine.name, "image", "inspect", DEBIAN_BASE], capture_output=True, check=False).returncode == 0:
        print(f"ok    base {DEBIAN_BASE} (made earlier)")
        return DEBIAN_BASE
    tar = work / "base.tar"
    engine.run(["mmdebstrap", "--quiet", "--variant=apt", f"--include={','.join(DEBIAN_PACKAGES)}", "bookworm", str(tar)], "mmdebstrap a bookworm root")
    engine.run([engine.name, "import", str(tar), DEBIAN_BASE], f"import it as {DEBIAN_BASE}")
    return DEBIAN_BASE


def version() -> str:
    return re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)


def check_service(engine: Engine, service: str, image: str, work: Path) -> list[str]:
    """The checks of a built CPU image; returns the failures."""
    failures = []
    config = engine.inspect(image)
    entrypoint, cmd, user = config.get("Entrypoint") or [], config.get("Cmd") or [], config.get("User")
    for ok, what in (
        (user == "10001:10001", f"USER {user} (the chart runs it as 10001:10001)"),
        (entrypoint == ["magic"], f"ENTRYPOINT {entrypoint}"),
        (cmd == ["serve", service], f"CMD {cmd}"),
    ):
        print(f"{'ok  ' if ok else 'FAIL'}  {service}: {what}")
        if not ok:
            failures.append(f"{service}: {what}")
    steps = []
    if entrypoint:  # the entry point itself: a missing or broken one fails here
        steps += [("user", [*entrypoint, "--version"]), ("user", [*entrypoint, "serve", "--help"])]
    steps.append(("user", ["python3", "-c", INSIDE, service, version(), ",".join(MODULES[service]), TORCH[service]]))
    if service == "reward":  # a privileged container (docker) must run the sandbox; a build step may only say why not
        steps.append(("root", ["python3", "-c", SANDBOX, *(["--require"] if engine.name == "docker" else [])]))
    if not engine.check_inside(image, steps, work / f"{service}.check.Containerfile", f"{service}: checks inside the image"):
        failures.append(f"{service}: a check inside the image failed (log: {engine.log})")
    return failures


def check_gpu_wheel(engine: Engine, service: str, base: str, work: Path) -> list[str]:
    tag = f"localhost/magic-{service}-wheel:check"
    if not engine.build(ROOT / "docker" / f"{service}.Dockerfile", tag, f"{service}: the wheel stage", {"PYTHON_IMAGE": base}, target="wheel", check=False):
        return [f"{service}: the wheel stage does not build"]
    probe = (
        "import glob, zipfile, sys; (w,) = glob.glob('/wheels/magic_rl-*.whl'); names = set(zipfile.ZipFile(w).namelist()); "
        f"missing = [f for f in {GPU_WHEEL_FILES!r} if f not in names]; "
        "ep = [n for n in names if n.endswith('entry_points.txt')]; text = zipfile.ZipFile(w).read(ep[0]).decode() if ep else ''; "
        "print('wheel', w, len(names), 'files; missing:', missing, '; console script magic:', 'magic = magic.cli:main' in text); "
        "sys.exit(1 if missing or 'magic = magic.cli:main' not in text else 0)"
    )
    checkfile = work / f"{service}-wheel.check.Containerfile"
    checkfile.write_text(f"FROM {tag}\nRUN {json.dumps(['python', '-c', probe])}\n")
    if not engine.build(checkfile, f"{tag}-checked", f"{service}: the wheel holds the package and its entry point", {}, check=False, no_cache=True):
        return [f"{service}: the wheel lacks files or its entry point (log: {engine.log})"]
    return []


def broken_variants(engine: Engine, base: str, work: Path) -> list[str]:
    """A wrong COPY path and a missing entry point: each must fail the build or the checks."""
    failures = []
    source = (ROOT / "docker" / "controller.Dockerfile").read_text()
    variants = {  # the breakage, and what must show in the log: the broken step itself, not a failure of anything else
        "a wrong COPY path": (source.replace("COPY services ./services", "COPY service ./services"), "COPY service ./services"),
        "a missing entry point": (source.replace('ENTRYPOINT ["magic"]', 'ENTRYPOINT ["magic-server"]'), "magic-server"),
    }
    for what, (text, sign) in variants.items():
        assert text != source, what
        dockerfile = work / f"broken-{what.split()[-1]}.Dockerfile"
        dockerfile.write_text(text)
        tag = f"localhost/magic-broken-{what.split()[-1]}:check"
        start = engine.log.stat().st_size if engine.log.exists() else 0
        built = engine.build(dockerfile, tag, f"broken Dockerfile ({what}): build", {"PYTHON_IMAGE": base}, check=False)
        failed = not built or bool(check_service(engine, "controller", tag, work))
        with engine.log.open("rb") as f:
            f.seek(start)
            caught = failed and sign in f.read().decode(errors="replace")
        print(f"{'ok  ' if caught else 'FAIL'}  a Dockerfile with {what} is {'caught' if caught else 'NOT caught'}")
        if not caught:
            failures.append(f"a Dockerfile with {what} passed the checks")
    return failures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=["podman", "docker"], default="podman")
    p.add_argument("--base", help="the base image (PYTHON_IMAGE); default: a Debian bookworm root made here with mmdebstrap")
    p.add_argument("--services", nargs="+", default=["controller", "reward"], choices=list(MODULES), help="rollout and learner only with --no-build (their vLLM base)")
    p.add_argument("--no-build", action="store_true", help="check images built already (--image SERVICE=REF)")
    p.add_argument("--image", action="append", default=[], help="SERVICE=REF of an image built already")
    p.add_argument("--gpu-wheels", action="store_true", help="also build and check the GPU images' wheel stage")
    p.add_argument("--broken", action="store_true", help="also check that broken Dockerfiles fail")
    p.add_argument("--log", type=Path, default=ROOT / ".images.log", help="where the builds' output goes (default: .images.log)")
    p.add_argument("--ca-bundle", type=Path, default=os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt",
                   help="the host's CA bundle, bind-mounted into the build's RUN steps (default: $PIP_CERT, $SSL_CERT_FILE or the system's)")
    args = p.parse_args(argv)
    if shutil.which(args.engine) is None:
        print(f"{args.engine} is not installed (Debian: apt-get install podman mmdebstrap uidmap)", file=sys.stderr)
        return 2
    images = dict(x.split("=", 1) for x in args.image)
    if not args.no_build and {"rollout", "learner"} & set(args.services):
        print("rollout and learner are built from vLLM's CUDA image: check them with --no-build --image (or their wheel stage: --gpu-wheels)", file=sys.stderr)
        return 2
    if args.no_build and (args.broken or args.gpu_wheels) and not args.base:
        print("--broken and --gpu-wheels build images: give --base, or leave out --no-build", file=sys.stderr)
        return 2
    if args.no_build and set(args.services) - set(images):
        print(f"--no-build needs --image SERVICE=REF for {sorted(set(args.services) - set(images))}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="magic-images-") as tmp:
        work = Path(tmp)
        ca = args.ca_bundle if args.ca_bundle and Path(args.ca_bundle).is_file() else None
        engine = Engine(args.engine, args.log, ca, work)
        engine.log.write_text("")
        failures: list[str] = []
        try:
            base = args.base or (None if args.no_build else debian_base(engine, work))
            for service in args.services:
                image = images.get(service) or f"localhost/magic-{service}:check"
                if not args.no_build:
                    engine.build(ROOT / "docker" / f"{service}.Dockerfile", image, f"{service}: build from docker/{service}.Dockerfile", {"PYTHON_IMAGE": base})
                failures += check_service(engine, service, image, work)
            if args.gpu_wheels:
                for service in ("rollout", "learner"):
                    failures += check_gpu_wheel(engine, service, base, work)
            if args.broken:
                failures += broken_variants(engine, base, work)
        except Failed as exc:
            failures.append(str(exc))
    print(f"\n{'FAILED' if failures else 'passed'} in {time.monotonic() - t0:.0f} s (log: {engine.log})")
    for f in failures:
        print(f"  - {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
