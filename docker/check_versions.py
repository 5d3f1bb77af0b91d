"""Fail an image build (or a test) when the installed packages differ from a constraints file.

    python3 check_versions.py docker/constraints.txt [package ...]
    python3 check_versions.py docker/constraints.txt --installed

Compares every pin `name==version` of the file (or only the named packages, or with
`--installed` only the pinned packages that are installed: an image that installs one service's
extra) with what importlib.metadata finds installed; a local label (torch 2.13.0+cpu) is ignored. Exit status 1,
with one line per difference, when a pinned package is missing or at another version: the image
would ship versions its tests never ran. Standard library only.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, version


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


def is_installed(name: str) -> bool:
    try:
        version(name)
    except PackageNotFoundError:
        return False
    return True


def main(argv: list[str]) -> int:
    only_installed = "--installed" in argv
    argv = [a for a in argv if a != "--installed"]
    with open(argv[1]) as f:
        wanted = pins(f.read())
    if only_installed:
        wanted = {n: v for n, v in wanted.items() if is_installed(n)}
    if len(argv) > 2:
        wanted = {n: wanted[n] for n in map(normalise, argv[2:])}
    problems = differences(wanted)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
