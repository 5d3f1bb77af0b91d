"""Configuration documents on disk: run specs, stage and plan files (JSON, or YAML with PyYAML)."""

from __future__ import annotations

import json
import sys


def load_file(path: str) -> dict:
    """A JSON (or, with PyYAML installed, YAML) document."""
    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    if path.endswith((".yaml", ".yml")):
        import yaml

        return yaml.safe_load(text)
    return json.loads(text)
