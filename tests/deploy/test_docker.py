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


UNPINNED_BASES = {
    "vllm/vllm-openai:v0.33.0": "PLACEHOLDER: no published digest of this tag could be looked up where the Dockerfiles were "
    "written (no registry access); append @sha256:... (docker buildx imagetools inspect) and delete this entry",
}
"""Base images still referenced by tag alone, each with why. This test fails when one of them gets
pinned (then remove it here) or when any other base is not pinned by digest."""

DIGEST = re.compile(r"^[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}$")


def stages(ins) -> list[tuple[str, str | None, list]]:
    """[(base, stage name, instructions)] of a multi-stage Dockerfile."""
    out = []
    for word, rest in ins:
        if word == "FROM":
            parts = rest.split()
            out.append((parts[0], parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else None, []))
        elif out:
            out[-1][2].append((word, rest))
    return out


@pytest.mark.parametrize("service", SERVICES)
def test_dockerfile_matches_the_chart(service):
    path = ROOT / "docker" / f"{service}.Dockerfile"
    ins = instructions(path)
    built = stages(ins)
    names = {name for _, name, _ in built if name}
    # multi-stage: what is built in one stage reaches the final image by COPY --from, the build tools do not
    assert len(built) >= 2 and names, f"{service}: not a multi-stage build"
    final = built[-1][2]
    assert any(w == "COPY" and r.startswith("--from=") and r.split()[0].removeprefix("--from=") in names for w, r in final), service
    for base, _, _ in built:
        if base in names:
            continue
        assert DIGEST.match(base) or base in UNPINNED_BASES, f"{service}: base image {base} is not pinned by tag and digest"
    (user,) = [rest for word, rest in final if word == "USER"][-1:]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    uid = values["podSecurityContext"]["runAsUser"]
    assert user == f"{uid}:{uid}", f"{service}: USER {user} is not the chart's runAsUser {uid}"
    entrypoint = [rest for word, rest in final if word == "ENTRYPOINT"][-1]
    cmd = [rest for word, rest in final if word == "CMD"][-1]
    assert entrypoint == '["magic"]' and cmd == f'["serve", "{service}"]'
    # only what the package needs is copied (no .venv, no .magic caches)
    copied = [src for word, rest in ins if word == "COPY" and not rest.startswith("--from") for src in rest.split()[:-1]]
    assert set(copied) <= {"pyproject.toml", "README.md", "proto", "services", f"docker/{constraints_of(service)}", "docker/check_versions.py"}, copied
    # the dependencies of the service's own extra are installed before the package arrives (sources
    # or the wheel built from them): a code change reuses that layer
    stage = next(body for _, _, body in built if any(w == "RUN" and "-r requirements.txt" in r for w, r in body))
    deps = next(i for i, (w, r) in enumerate(stage) if w == "RUN" and "-r requirements.txt" in r)
    arrives = [i for i, (w, r) in enumerate(stage) if w == "COPY" and (r.split()[0] in ("services", "proto") or r.startswith("--from="))]
    assert arrives and deps < min(arrives), f"{service}: the dependencies are installed after the package's sources"
    extras = set(re.findall(r"\[\\?'([a-z]+)\\?'\]", stage[deps][1])) - {"project", "dependencies", "optional-dependencies"}
    expected = {"learner": {"learner", "deepspeed"}, "reward": {"reward", "codejudge"}}.get(service, {service})  # the code judge runs from the reward image
    assert extras == expected, f"{service}: installs the extras {extras}"
    assert any(w == "RUN" and "install --no-deps" in r for w, r in stage[deps:]), f"{service}: the package must be installed --no-deps"
    checks = " ".join(r for w, r in stage if w == "RUN" and "check_versions.py" in r)
    assert f"check_versions.py {constraints_of(service)}" in checks, f"{service}: no version check"
    if constraints_of(service) == "constraints-vllm.txt":  # nothing the build adds to vLLM's packages floats
        assert "-c constraints-vllm.txt" in stage[deps][1] and "--base vllm-image.txt" in checks, service
    # Debian packages at fixed versions
    for w, r in ins:
        if w == "RUN" and "apt-get install" in r:
            packages = [a for a in r.split("apt-get install", 1)[1].split("&&")[0].split() if not a.startswith("-")]
            assert packages and all(re.fullmatch(r'"?[\w.+-]+=[\w.+~:${}-]+"?', a) for a in packages), f"{service}: unpinned apt packages {packages}"


def test_unpinned_bases_are_only_the_listed_placeholders():
    used = {rest.split()[0] for s in SERVICES for word, rest in instructions(ROOT / "docker" / f"{s}.Dockerfile") if word == "FROM"}
    assert set(UNPINNED_BASES) <= used, "a listed base is no longer used unpinned: remove it from UNPINNED_BASES"


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
    assert set(VLLM_BOUNDS) <= set(gpu)
    # what the images add to vLLM's packages (DeepSpeed and its dependencies, the project's own
    # that vLLM lacks) is pinned at the versions CI runs
    from importlib.metadata import version

    added = {name: pinned for name, pinned in gpu.items() if name not in VLLM_BOUNDS}
    assert {"deepspeed", "redis", "pydantic-settings"} <= set(added)
    for name, pinned in added.items():
        assert version(name).split("+")[0] == pinned, f"docker/constraints-vllm.txt pins {name}=={pinned}, CI runs {version(name)}"
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(d) for d in meta["dependencies"] + [d for extra in meta["optional-dependencies"].values() for d in extra]]
    project = {r.name: r.specifier for r in requirements if r.name != meta["name"]}
    cpu = check.pins((ROOT / "docker" / "constraints.txt").read_text())
    assert project["deepspeed"] == SpecifierSet(f"=={gpu['deepspeed']}"), "pyproject.toml's deepspeed pin is not the learner image's"
    for name, bound in VLLM_BOUNDS.items():
        assert gpu[name] in SpecifierSet(bound), f"{name} {gpu[name]} breaks vLLM's {bound}"
        assert gpu[name] in project[name] and cpu[name] in project[name], f"pyproject.toml's {name}{project[name]} excludes a shipped version"
    assert "vllm/vllm-openai:v0.33." in (ROOT / "docker" / "rollout.Dockerfile").read_text()


def closure(requirements: list[str]) -> set[str]:
    """Every distribution `requirements` pull in (unconditional requirements, transitively), as
    this test environment's installed metadata declares them: what pip installs for them."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    check = load_check_versions()
    seen, todo = set(), [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = check.normalise(req.name)
        if name in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            todo += [Requirement(r) for r in requires(name) or []]
        except PackageNotFoundError:
            pass
    return seen


@pytest.mark.parametrize("service", ["controller", "reward"])
def test_cpu_service_extras_pull_in_no_torch(service):
    """The controller's and the reward's images install the base and their own extra: nothing in
    that closure needs torch (a new dependency that does, e.g. accelerate, fails here)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = closure(project["dependencies"] + project["optional-dependencies"][service])
    assert not installed & {"torch", "deepspeed", "vllm", "triton"}, sorted(installed)
    assert {"redis", "pydantic-settings"} <= installed  # the walk follows requirements
    assert closure(project["optional-dependencies"]["rollout"]) >= {"torch"}


def test_check_versions_refuses_what_floats():
    check = load_check_versions()
    base, pinned = {"torch": "2.14.1+cu128", "numpy": "2.2.0"}, {"deepspeed": "0.19.8"}
    assert check.floating(base, pinned, {"torch": "2.14.1", "numpy": "2.2.0", "deepspeed": "0.19.8"}) == []
    assert check.floating(base, pinned, {"torch": "2.14.1", "numpy": "2.3.0", "hjson": "3.1.0", "deepspeed": "0.19.8"}) == [
        "hjson==3.1.0: neither in the base image nor pinned in the constraints file (pin it there)",
        "numpy==2.3.0: neither in the base image nor pinned in the constraints file (pin it there)",
    ]


# -- the images workflow ---------------------------------------------------------------------------


def test_workflow_builds_pushes_and_records_every_image():
    """.github/workflows/images.yml: one build per Dockerfile with docker/build-push-action, pushed
    to the repositories the chart pulls by default, tagged with the chart's appVersion, and the
    digests collected into a values file."""
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "images.yml").read_text())
    triggers = flow.get("on", flow.get(True))  # YAML 1.1 reads the key `on` as true
    assert triggers["push"]["tags"] == ["v*"] and "workflow_dispatch" in triggers
    assert flow["permissions"]["packages"] == "write" and flow["permissions"]["contents"] == "read"
    build = flow["jobs"]["build"]
    assert sorted(build["strategy"]["matrix"]["service"]) == sorted(SERVICES)
    steps = {s.get("id") or s.get("uses", s.get("name")): s for s in build["steps"]}
    push = steps["build"]
    assert push["uses"].startswith("docker/build-push-action@")
    assert push["with"]["file"] == "docker/${{ matrix.service }}.Dockerfile" and push["with"]["context"] == "."
    assert push["with"]["push"] is True
    meta = steps["meta"]["with"]
    assert meta["images"] == "${{ env.REGISTRY }}/magic-${{ matrix.service }}"
    assert "type=raw,value=${{ needs.version.outputs.version }}" in meta["tags"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for service in SERVICES:
        image = values[service]["image"]
        assert image["repository"] == f"{flow['env']['REGISTRY']}/magic-{service}", f"{service}: the chart pulls another name than the workflow pushes"
        assert image["tag"] == ""  # = the chart's appVersion, the version the workflow tags
    version = " ".join(s.get("run", "") for s in flow["jobs"]["version"]["steps"])
    assert "charts/magic/Chart.yaml" in version and "pyproject.toml" in version and "GITHUB_REF_NAME" in version
    record = " ".join(s.get("run", "") for s in build["steps"])
    assert "steps.build.outputs.digest" in record
    collect = " ".join(s.get("run", "") for s in flow["jobs"]["digests"]["steps"])
    assert "image-digests.yaml" in collect and "digest:" in collect
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["home"].startswith("https://github.com/" + flow["env"]["REGISTRY"].split("/")[1] + "/")


def test_workflow_checks_and_scans_each_image_before_it_pushes_it_with_pinned_actions():
    """Every action pinned by commit (a tag can be moved); each image built into the runner's Docker,
    checked from the inside by docker/check_images.py (what `make images` runs here) and scanned,
    all before the step that pushes it."""
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "images.yml").read_text())
    uses = [s["uses"] for job in flow["jobs"].values() for s in job["steps"] if "uses" in s]
    assert uses and all(re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", u) for u in uses), [u for u in uses if not re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", u)]
    steps = flow["jobs"]["build"]["steps"]
    order = [s.get("id") or s.get("name") or s.get("uses") for s in steps]
    built = next(i for i, s in enumerate(steps) if s.get("id") == "image")
    checked = next(i for i, s in enumerate(steps) if "docker/check_images.py" in s.get("run", ""))
    scanned = next(i for i, s in enumerate(steps) if s.get("uses", "").startswith("aquasecurity/trivy-action@"))
    pushed = next(i for i, s in enumerate(steps) if s.get("id") == "build")
    assert built < checked < pushed and built < scanned < pushed, order
    assert steps[built]["with"]["push"] is False and steps[built]["with"]["load"] is True
    assert "--engine docker --no-build" in steps[checked]["run"] and steps[scanned]["with"]["exit-code"] == "1"
