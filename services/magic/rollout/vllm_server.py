"""The vLLM server beside a rollout worker, as a child process: start, readiness, supervision, stop.

On Kubernetes the chart runs vLLM as a sidecar container of the rollout pod. Locally
(`magic local --engine vllm`, the tests) the rollout service starts the same server itself when
`MAGIC_VLLM_LAUNCH=true`, with the interpreter of the separate vLLM virtualenv (`make vllm-venv`,
`<repo>/.venv-vllm`), and watches it:

* start — `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script of the CPU
  build is broken) with what the engine needs: `--logprobs-mode processed_logprobs`, the worker
  extension (`magic.rollout.vllm_ext`), `VLLM_SERVER_DEV_MODE=1` for the pause / reload routes;
  a small CPU KV cache (`VLLM_CPU_KVCACHE_SPACE`). Its output goes to a log file.
* ready — `GET /health` answers 200; while waiting, an exited process is reported at once with
  its exit code and the tail of its log (a model that does not fit `--max-model-len`, a bad
  flag), never a silent hang.
* supervision — `problem()` says why the server cannot serve (exited, with the log tail); the
  engine raises `VllmServerDied` with it, and the worker process ends so that its groups are
  redelivered (docs/rollout.md).
* stop — SIGTERM to the server's process group, SIGKILL after a grace period.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from magic.observability import logs
from magic.runtime.ports import free_port
from magic.runtime.processes import die_with_parent

log = logging.getLogger(__name__)

EXTENSION = "magic.rollout.vllm_ext.MagicWorkerExtension"
VENV_DIR = ".venv-vllm"


class VllmServerError(RuntimeError):
    """The vLLM server could not be started, or it stopped."""


def default_python() -> Path:
    """The vLLM virtualenv's interpreter: `<repo>/.venv-vllm/bin/python` next to this source tree."""
    repo = Path(__file__).resolve().parents[3]  # <repo>/services/magic/rollout/vllm_server.py
    return repo / VENV_DIR / "bin" / "python"


def extension_path(shim_dir: Path) -> Path:
    """A directory that makes `magic.rollout.vllm_ext` importable in vLLM's interpreter without
    installing `magic` there: `<shim_dir>/magic` links to this package."""
    shim_dir.mkdir(parents=True, exist_ok=True)
    link = shim_dir / "magic"
    target = Path(__file__).resolve().parents[1]
    if link.is_symlink() and link.resolve() == target:
        return shim_dir
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target, target_is_directory=True)
    return shim_dir


@dataclass
class VllmServerConfig:
    """How to start one vLLM OpenAI server for the engine."""

    model: str
    python: Path = field(default_factory=default_python)
    host: str = "127.0.0.1"
    port: int = 0
    """0: a free port."""
    max_model_len: int | None = None
    kv_cache_gib: int = 1
    """VLLM_CPU_KVCACHE_SPACE: the CPU backend's KV cache, GiB."""
    dtype: str = "float32"
    seed: int = 0
    extra_args: list[str] = field(default_factory=list)
    logprobs_mode: str = "processed_logprobs"
    chunked_prefill: bool | None = None
    """None: off when this machine has no CUDA device, vLLM's default (on) otherwise. vLLM 0.32's
    CPU worker cannot rewind a seeded request's generator after a partial (chunked) prefill: the
    first batch whose prompts exceed the step's token budget kills its engine core
    (`RuntimeError: CPU Generator does not use offset`). Without chunked prefill each prompt is
    prefilled whole, and vLLM raises the token budget to at least max_model_len."""


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def server_command(config: VllmServerConfig, port: int) -> list[str]:
    """The command line of the server."""
    cmd = [
        str(config.python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", config.model,
        "--host", config.host, "--port", str(port),
        "--dtype", config.dtype,
        "--seed", str(config.seed),
        "--logprobs-mode", config.logprobs_mode,
        "--worker-extension-cls", EXTENSION,
    ]
    if config.max_model_len:
        cmd += ["--max-model-len", str(config.max_model_len)]
    chunked = config.chunked_prefill if config.chunked_prefill is not None else cuda_available()
    if not chunked:
        cmd += ["--no-enable-chunked-prefill"]
    return cmd + list(config.extra_args)


def server_env(config: VllmServerConfig, shim_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        VLLM_SERVER_DEV_MODE="1",
        VLLM_CPU_KVCACHE_SPACE=str(config.kv_cache_gib),
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env["PYTHONPATH"] = os.pathsep.join([str(extension_path(shim_dir))] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    for name in ("VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(name, None)
    return env


class VllmServer:
    """One supervised vLLM server process."""

    def __init__(self, config: VllmServerConfig, log_path: Path):
        self.config = config
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self.port = config.port
        self._log = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def start(self, timeout: float = 600.0) -> "VllmServer":
        """Start the server and wait until it answers /health; raises VllmServerError with the
        reason (missing venv, exited early, not ready in time)."""
        if not self.config.python.exists():
            raise VllmServerError(f"no vLLM interpreter at {self.config.python}: run `make vllm-venv` (or set MAGIC_VLLM_PYTHON)")
        self.port = self.config.port or free_port()
        if self.proc is not None:  # started before: what is left of that session (its engine core outlives a killed leader)
            self._kill_session()
        if self._log is not None:
            self._log.close()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        cmd = server_command(self.config, self.port)
        log.info("starting vLLM server on port %d: %s (log %s)", self.port, " ".join(cmd), self.log_path)
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=server_env(self.config, self.log_path.parent / "vllm-ext"), start_new_session=True, preexec_fn=die_with_parent,
        )
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        log.info("vLLM server ready at %s (pid %d)", self.url, self.proc.pid)
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5.0) as http:
            while time.monotonic() < deadline:
                problem = self.problem()
                if problem:
                    raise VllmServerError(problem)
                try:
                    if http.get(f"{self.url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        raise VllmServerError(f"the vLLM server was not ready within {timeout:.0f}s; last lines of {self.log_path}:\n{self.log_tail()}")

    def problem(self) -> str | None:
        """Why the server cannot serve (it exited), or None while it runs."""
        if self.proc is None:
            return "the vLLM server was not started"
        code = self.proc.poll()
        if code is None:
            return None
        return f"the vLLM server (pid {self.proc.pid}) exited with code {code}; last lines of {self.log_path}:\n{self.log_tail()}"

    def log_tail(self, lines: int = 30) -> str:
        return logs.tail(self.log_path, lines)

    def _kill_session(self) -> None:
        """SIGKILL every process of the server's session (it was started in its own), then reap the leader."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()

    def stop(self, grace: float = 15.0) -> None:
        """Stop the server and whatever it started (its engine-core process): the whole session."""
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGTERM)
                    self.proc.wait(grace)
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    pass
            self._kill_session()  # the leader may be gone while its children are not
        if self._log is not None:
            self._log.close()
            self._log = None


def launch_server(settings, model_path: str) -> VllmServer:
    """Start the vLLM server a rollout worker with `vllm_launch` supervises (`RolloutSettings`)."""
    config = VllmServerConfig(
        model=model_path,
        python=settings.vllm_python or default_python(),
        max_model_len=settings.vllm_max_model_len,
        kv_cache_gib=settings.vllm_kv_cache_gib,
        extra_args=list(settings.vllm_extra_args),
    )
    log_path = settings.data_dir / "vllm" / f"{settings.worker_name}.log"
    return VllmServer(config, log_path).start(settings.vllm_start_timeout_seconds)
