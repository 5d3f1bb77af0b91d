"""The committed generated code must equal what `make proto` produces now."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_generated_code_is_fresh(tmp_path):
    spec = importlib.util.spec_from_file_location("generate", ROOT / "proto" / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    written = generate.generate(tmp_path)
    assert written, "no .proto files found"
    for path in written:
        committed = ROOT / "services" / "magic" / "protocol" / "pb" / path.name
        assert committed.exists(), f"{committed} is missing: run `make proto`"
        assert committed.read_text() == path.read_text(), f"{committed} is stale: run `make proto`"
