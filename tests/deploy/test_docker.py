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
    copies = {rest.split()[0] for word, rest in ins if word == "COPY" and not rest.startswith("--from")}
    assert copies == {"pyproject.toml", "proto", "services"}
