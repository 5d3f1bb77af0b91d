"""The Dockerfiles against the chart (no Docker engine runs in CI: the images are not built here).

Checked: one Dockerfile per service, base images pinned to a version, a numeric non-root USER that
is the chart's runAsUser, and an entrypoint that accepts the chart's `args: [serve, <service>]`.
"""

from __future__ import annotations

import re

import pytest
import yaml

from .conftest import CHART, ROOT

pytestmark = pytest.mark.deploy

SERVICES = ("controller", "rollout", "reward", "learner")


def instructions(path):
    text = re.sub(r"\\\n", " ", path.read_text())
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), rest.strip())))
    return out


@pytest.mark.parametrize("service", SERVICES)
def test_dockerfile_matches_the_chart(service):
    path = ROOT / "docker" / f"{service}.Dockerfile"
    ins = instructions(path)
    bases = [rest.split()[0] for word, rest in ins if word == "FROM"]
    assert bases
    for base in bases:
        if base == "build":
            continue
        name, _, tag = base.partition(":")
        assert re.fullmatch(r"v?\d+\.\d+\.\d+[\w.-]*", tag), f"{service}: base image {base} is not pinned to a version"
    (user,) = [rest for word, rest in ins if word == "USER"][-1:]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    uid = values["podSecurityContext"]["runAsUser"]
    assert user == f"{uid}:{uid}", f"{service}: USER {user} is not the chart's runAsUser {uid}"
    entrypoint = [rest for word, rest in ins if word == "ENTRYPOINT"][-1]
    cmd = [rest for word, rest in ins if word == "CMD"][-1]
    assert entrypoint == '["magic"]' and cmd == f'["serve", "{service}"]'
    # only what the package needs is copied (no .venv, no .magic caches)
    copied = [src for word, rest in ins if word == "COPY" and not rest.startswith("--from") for src in rest.split()[:-1]]
    assert set(copied) <= {"pyproject.toml", "README.md", "proto", "services", f"docker/{constraints_of(service)}", "docker/check_versions.py"}, copied
    # the dependencies are installed before the sources arrive: a code change reuses that layer
    steps = [(word, rest) for word, rest in ins]
    sources = min(i for i, (w, r) in enumerate(steps) if w == "COPY" and r.split()[0] in ("services", "proto"))
    deps = [i for i, (w, r) in enumerate(steps) if w == "RUN" and "-r requirements.txt" in r]
    assert deps and deps[0] < sources, f"{service}: the dependencies are installed after the sources are copied"
    assert any(w == "RUN" and "install --no-deps ." in r for w, r in steps[sources:]), f"{service}: the package must be installed --no-deps"
    assert any(w == "RUN" and f"check_versions.py {constraints_of(service)}" in r for w, r in steps), f"{service}: no version check"


def constraints_of(service: str) -> str:
    """The versions an image must ship: CI's (constraints.txt) without vLLM, vLLM's with it."""
    return "constraints-vllm.txt" if service in ("rollout", "learner") else "constraints.txt"


def test_build_context_holds_only_what_the_images_copy():
    lines = [x.strip() for x in (ROOT / ".dockerignore").read_text().splitlines() if x.strip() and not x.startswith("#")]
    assert lines[0] == "*", "everything excluded by default"
    allowed = {x[1:].rstrip("/") for x in lines if x.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "proto", "services", "docker/constraints.txt", "docker/constraints-vllm.txt", "docker/check_versions.py"}


def test_service_images_do_not_install_matplotlib():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.lower().startswith("matplotlib")]
    assert any(d.startswith("matplotlib") for d in project["optional-dependencies"]["local"])


def load_check_versions():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_versions", ROOT / "docker" / "check_versions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_images_ship_the_versions_ci_tests():
    """docker/constraints.txt (controller, reward images) == what this test environment runs."""
    import subprocess
    import sys

    check = load_check_versions()
    pins = check.pins((ROOT / "docker" / "constraints.txt").read_text())
    assert {"torch", "transformers", "fastapi"} <= set(pins)
    import tomllib
    from packaging.requirements import Requirement

    direct = {check.normalise(Requirement(d).name) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    assert direct <= set(pins), f"runtime dependencies without a pin in docker/constraints.txt: {sorted(direct - set(pins))}"
    done = subprocess.run([sys.executable, str(ROOT / "docker" / "check_versions.py"), str(ROOT / "docker" / "constraints.txt")], capture_output=True, text=True)
    assert done.returncode == 0, "the CPU images would ship other versions than CI tests:\n" + done.stderr
    makefile = (ROOT / "Makefile").read_text()
    assert f"TORCH_SPEC ?= torch=={pins['torch']}" in makefile
    for service in ("controller", "reward"):  # their extras carry no torch: neither do their images
        dockerfile = (ROOT / "docker" / f"{service}.Dockerfile").read_text()
        assert "torch" not in dockerfile.replace("no torch", "") and "check_versions.py constraints.txt --installed" in dockerfile, service


def test_check_versions_reports_every_difference():
    check = load_check_versions()
    assert check.differences({"pyyaml": "0.0.1", "no-such-package-xyz": "1.0"}) == [
        "no-such-package-xyz: pinned 1.0, not installed",
        f"pyyaml: pinned 0.0.1, installed {__import__('importlib.metadata').metadata.version('pyyaml')}",
    ]
    with pytest.raises(ValueError):
        check.pins("torch>=2")


VLLM_BOUNDS = {"torch": ">=2.14,<2.15", "transformers": "<5.21", "fastapi": "<0.137"}
"""What vLLM 0.33 (the GPU images' base, docker/rollout.Dockerfile) requires of the three."""


def test_gpu_stack_fits_vllm_and_the_project():
    """docker/constraints-vllm.txt (what the rollout and learner images are built to ship, checked
    at build time) lies within vLLM 0.33's bounds and within the project's own ranges."""
    import tomllib
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    check = load_check_versions()
    gpu = check.pins((ROOT / "docker" / "constraints-vllm.txt").read_text())
    assert set(gpu) == set(VLLM_BOUNDS)
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(d) for d in meta["dependencies"] + [d for extra in meta["optional-dependencies"].values() for d in extra]]
    project = {r.name: r.specifier for r in requirements if r.name != meta["name"]}
    cpu = check.pins((ROOT / "docker" / "constraints.txt").read_text())
    for name, bound in VLLM_BOUNDS.items():
        assert gpu[name] in SpecifierSet(bound), f"{name} {gpu[name]} breaks vLLM's {bound}"
        assert gpu[name] in project[name] and cpu[name] in project[name], f"pyproject.toml's {name}{project[name]} excludes a shipped version"
    assert "vllm/vllm-openai:v0.33." in (ROOT / "docker" / "rollout.Dockerfile").read_text()
