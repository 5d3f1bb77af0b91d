"""Service processes for local runs and end-to-end tests: start, watch, stop.

Each service runs as its own OS process (`python -m magic.<service>`), its output in a log file.
`first_exit()` reports the first process that has ended, so the caller can stop everything
instead of hanging on a loop that lost a member.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from magic.observability import logs
from magic.runtime.processes import die_with_parent


def _die_with_launcher() -> None:
    die_with_parent(signal.SIGKILL)


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        return logs.tail(self.log_path, lines)


class Supervisor:
    def __init__(self, log_dir: Path, base_env: dict[str, str]):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.base_env = base_env
        self.services: list[Service] = []

    def start(self, name: str, module: str, env: dict[str, str] | None = None) -> Service:
        log_path = self.log_dir / f"{name}.log"
        full_env = {**os.environ, **self.base_env, **(env or {}), "MAGIC_WORKER_NAME": name, "PYTHONUNBUFFERED": "1"}
        with log_path.open("ab") as log:
            # SIGKILL if the launcher dies without stopping it: its Redis dies with it, so there is
            # nothing left to stop gracefully for, and a graceful stop waits for whatever the
            # service is in the middle of (loading a model took 27 s on a loaded machine)
            proc = subprocess.Popen([sys.executable, "-m", module], env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=_die_with_launcher)
        svc = Service(name, proc, log_path)
        self.services.append(svc)
        return svc

    def first_exit(self) -> Service | None:
        for svc in self.services:
            if svc.proc.poll() is not None:
                return svc
        return None

    def get(self, name: str) -> Service:
        return next(s for s in self.services if s.name == name)

    def kill(self, name: str) -> None:
        """Kill one service abruptly (SIGKILL), as a crash would."""
        svc = self.get(name)
        os.killpg(svc.proc.pid, signal.SIGKILL)
        svc.proc.wait()
        self.services.remove(svc)

    def stop_all(self, timeout: float = 15.0) -> None:
        for svc in self.services:
            if svc.proc.poll() is None:
                try:
                    os.killpg(svc.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for svc in self.services:
            remaining = max(0.1, deadline - time.monotonic())
            try:
                svc.proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(svc.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                svc.proc.wait()
