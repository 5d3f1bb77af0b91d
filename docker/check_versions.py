"""Fail an image build (or a test) when the installed packages differ from a constraints file.

    python3 check_versions.py docker/constraints.txt [package ...]
    python3 check_versions.py docker/constraints.txt --installed
    python3 check_versions.py docker/constraints-vllm.txt --installed --base vllm-image.txt

Compares every pin `name==version` of the file (or only the named packages, or with
`--installed` only the pinned packages that are installed: an image that installs one service's
extra) with what importlib.metadata finds installed; a local label (torch 2.13.0+cpu) is ignored. Exit status 1,
with one line per difference, when a pinned package is missing or at another version: the image
would ship versions its tests never ran. With `--base FILE` (the `pip list --format=freeze` of the
base image, taken before anything was installed) it also fails on every installed package that is
neither in the base image at that version nor pinned in the constraints file: nothing the build
added floats (a new dependency of DeepSpeed, say, must be pinned before the image builds).
Standard library only.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, distributions, version


def pins(text: str) -> dict[str, str]:
    """{normalised name: version} of the `name==version` lines (comments and blanks skipped)."""
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, ver = line.partition("==")
            if not sep:
                raise ValueError(f"not a name==version pin: {line!r}")
            out[normalise(name)] = ver.strip()
    return out


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower().strip()


def differences(wanted: dict[str, str]) -> list[str]:
    problems = []
    for name, pinned in sorted(wanted.items()):
        try:
            installed = version(name).split("+", 1)[0]
        except PackageNotFoundError:
            problems.append(f"{name}: pinned {pinned}, not installed")
            continue
        if installed != pinned:
            problems.append(f"{name}: pinned {pinned}, installed {installed}")
    return problems


def floating(base: dict[str, str], pinned: dict[str, str], installed: dict[str, str] | None = None) -> list[str]:
    """Installed packages that are neither the base image's (same version) nor pinned."""
    if installed is None:
        installed = {normalise(d.metadata["Name"]): d.version.split("+", 1)[0] for d in distributions()}
    problems = []
    for name, ver in sorted(installed.items()):
        if base.get(name, "").split("+", 1)[0] != ver and pinned.get(name) != ver:
            problems.append(f"{name}=={ver}: neither in the base image nor pinned in the constraints file (pin it there)")
    return problems


def is_installed(name: str) -> bool:
    try:
        version(name)
    except PackageNotFoundError:
        return False
    return True


def main(argv: list[str]) -> int:
    only_installed = "--installed" in argv
    argv = [a for a in argv if a != "--installed"]
    base = None
    if "--base" in argv:
        i = argv.index("--base")
        with open(argv[i + 1]) as f:
            base = {normalise(n): v for n, v in pins(f.read()).items()}
        del argv[i : i + 2]
    with open(argv[1]) as f:
        wanted = pins(f.read())
    every_pin = dict(wanted)
    if only_installed:
        wanted = {n: v for n, v in wanted.items() if is_installed(n)}
    if len(argv) > 2:
        wanted = {n: wanted[n] for n in map(normalise, argv[2:])}
    problems = differences(wanted)
    if base is not None:
        problems += floating(base, every_pin)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
