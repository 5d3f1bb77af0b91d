"""Starting the vLLM server beside a rollout worker: its command line, and the errors of a start
that cannot work (real subprocesses; the real server runs in tests/integration/test_vllm_engine.py)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from magic.local.launcher import engine_env, transport_env
from magic.rollout import vllm_ext
from magic.rollout.settings import RolloutSettings
from magic.rollout.vllm_server import EXTENSION, VllmServer, VllmServerConfig, VllmServerError, extension_path, server_command, server_env


def test_the_command_line_has_what_the_engine_checks_for():
    cmd = server_command(VllmServerConfig(model="/m", max_model_len=128, extra_args=["--max-num-seqs", "64"]), 8123)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # the CPU wheel's `vllm` script is broken
    joined = " ".join(cmd)
    assert "--logprobs-mode processed_logprobs" in joined and f"--worker-extension-cls {EXTENSION}" in joined
    assert "--port 8123" in joined and "--max-model-len 128" in joined and joined.endswith("--max-num-seqs 64")


def test_chunked_prefill_is_off_on_a_cpu_server_unless_asked_for(monkeypatch):
    """vLLM 0.32's CPU worker dies on a partial prefill of a seeded request (every group is seeded)."""
    from magic.rollout import vllm_server

    monkeypatch.setattr(vllm_server, "cuda_available", lambda: False)
    assert "--no-enable-chunked-prefill" in server_command(VllmServerConfig(model="/m"), 1)
    assert "--no-enable-chunked-prefill" not in server_command(VllmServerConfig(model="/m", chunked_prefill=True), 1)
    monkeypatch.setattr(vllm_server, "cuda_available", lambda: True)
    assert "--no-enable-chunked-prefill" not in server_command(VllmServerConfig(model="/m"), 1)
    assert "--no-enable-chunked-prefill" in server_command(VllmServerConfig(model="/m", chunked_prefill=False), 1)


def test_the_environment_enables_the_dev_routes_and_makes_the_extension_importable(tmp_path):
    env = server_env(VllmServerConfig(model="/m", kv_cache_gib=2), tmp_path / "shim")
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    shim = Path(env["PYTHONPATH"].split(":")[0])
    assert (shim / "magic" / "rollout" / "vllm_ext.py").resolve() == Path(vllm_ext.__file__).resolve()
    assert extension_path(shim) == shim  # idempotent


def test_the_extension_imports_nothing_from_magic_at_module_level():
    """It runs in vLLM's interpreter, where only this module's own file is reachable."""
    tree = ast.parse(Path(vllm_ext.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all(getattr(n, "module", None) == "__future__" for n in top)


def test_a_missing_vllm_interpreter_says_how_to_make_it(tmp_path):
    with pytest.raises(VllmServerError, match="make vllm-venv"):
        VllmServer(VllmServerConfig(model="/m", python=tmp_path / "nope" / "python"), tmp_path / "s.log").start(timeout=5)


def test_a_server_that_exits_while_starting_is_reported_with_its_log(tmp_path):
    """This interpreter has no vLLM: the real process exits at once, and the error carries why."""
    server = VllmServer(VllmServerConfig(model="/m", python=Path(sys.executable)), tmp_path / "s.log")
    with pytest.raises(VllmServerError, match=r"(?s)exited with code 1.*No module named 'vllm'"):
        server.start(timeout=120)
    assert server.proc.poll() is not None and "exited" in server.problem()


def test_rollout_settings_for_a_launched_server(monkeypatch):
    monkeypatch.setenv("MAGIC_VLLM_LAUNCH", "true")
    monkeypatch.setenv("MAGIC_VLLM_EXTRA_ARGS", '["--max-num-seqs", "64"]')
    s = RolloutSettings()
    assert s.vllm_launch and s.vllm_extra_args == ["--max-num-seqs", "64"] and s.vllm_kv_cache_gib == 1


def test_magic_local_engine_and_transport_settings():
    assert engine_env("vllm") == {"MAGIC_ENGINE": "vllm", "MAGIC_VLLM_LAUNCH": "true"}
    assert engine_env("torch") == {"MAGIC_ENGINE": "torch"}
    import json

    http = json.loads(transport_env("http")["MAGIC_WEIGHT_TRANSPORT"])
    assert http["type"] == "http" and http["advertise_url"] == f"http://127.0.0.1:{http['port']}"
    assert json.loads(transport_env("filesystem")["MAGIC_WEIGHT_TRANSPORT"]) == {"type": "filesystem"}
