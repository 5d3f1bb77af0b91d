"""checkov (Bridgecrew's policy scanner, `--framework kubernetes`) on the chart's default render,
hooks and the `helm test` pod included: it fails no more checks, as a share, than the reference
charts did with their defaults (bitnami redis 3.2%, KubeRay operator 4.2%), and every check it
still fails is listed, with its reason, in docs/security.md — a new failure, or a listed one
that no longer fails, fails this test. checkov runs from its own venv (`make test` installs it:
the Makefile's CHECKOV_VENV)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from .conftest import NAMESPACE, RELEASE, ROOT

pytestmark = pytest.mark.deploy

REFERENCE_SHARE = 0.032
"""The lower of the two reference charts' failed shares (bitnami redis)."""


def checkov_binary() -> str | None:
    for candidate in (os.environ.get("CHECKOV"), str(ROOT / ".venv-checkov" / "bin" / "checkov"), shutil.which("checkov")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def documented() -> set[tuple[str, str]]:
    """{(check id, "Kind/component")} of docs/security.md's table of remaining failures."""
    out = set()
    for line in (ROOT / "docs" / "security.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.match(r"`?CKV", cells[0]):
            out |= {(check, obj.strip(" `")) for check in re.findall(r"CKV2?_K8S_\d+", cells[0]) for obj in cells[1].split(",")}
    return out


@pytest.fixture(scope="module")
def scan(chart, tmp_path_factory):
    binary = checkov_binary()
    if binary is None:
        pytest.skip("checkov is not installed: `make test` installs it into .venv-checkov")
    out = chart.render(values=None, name=RELEASE, namespace=NAMESPACE, is_install=True)
    manifests = tmp_path_factory.mktemp("checkov") / "default.yaml"
    manifests.write_text("\n---\n".join(text for path, text in sorted(out.items()) if path.endswith(".yaml")))
    done = subprocess.run([binary, "--framework", "kubernetes", "-f", str(manifests), "--quiet", "--compact", "-o", "json"], capture_output=True, text=True, timeout=300)
    report = json.loads(done.stdout)
    report = report[0] if isinstance(report, list) else report
    assert report["summary"]["parsing_errors"] == 0, done.stderr[-2000:]
    return report


def test_checkov_fails_no_more_than_the_reference_charts(scan):
    summary = scan["summary"]
    share = summary["failed"] / (summary["failed"] + summary["passed"])
    assert summary["passed"] > 500, summary  # the scan saw the whole render
    assert share <= REFERENCE_SHARE, f"checkov fails {summary['failed']} of {summary['failed'] + summary['passed']} checks ({share:.1%})"


def test_every_remaining_failure_is_documented_with_its_reason(scan):
    failures = set()
    for result in scan["results"]["failed_checks"]:
        kind, _, name = result["resource"].split(".", 2)
        failures.add((result["check_id"], f"{kind}/{name.split('.')[-1].removeprefix(f'{RELEASE}-magic-')}"))
    listed = documented()
    assert not failures - listed, f"failures not listed in docs/security.md: {sorted(failures - listed)}"
    assert not listed - failures, f"docs/security.md lists checks that no longer fail: {sorted(listed - failures)}"
