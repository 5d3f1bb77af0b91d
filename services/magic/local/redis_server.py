"""A private redis-server on a free loopback port, for local runs and tests.

It keeps nothing on disk (no RDB snapshots, no AOF) and lives in its own temporary directory;
`stop()` shuts it down and removes the directory. Like the chart's Redis it runs with
`maxmemory` and `maxmemory-policy noeviction`: when full it refuses writes (the services retry
them, `magic.store.client`) instead of growing until the machine runs out of memory.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from magic.runtime.ports import free_port
from magic.runtime.processes import die_with_parent
from magic.store.client import answers_at


DEFAULT_MAXMEMORY = "2gb"
"""Local runs move a few MB a step; a run at the paper's shape needs ≈ 1 GB (docs/scale.md)."""


class RedisServer:
    def __init__(self, executable: str = "redis-server", maxmemory: str = DEFAULT_MAXMEMORY, appendfsync: str | None = None):
        """`appendfsync`: None runs without an append-only file (`magic local`: its run dies with it);
        "always", "everysec" or "no" keeps one in the server's directory (the benchmarks' comparison)."""
        path = shutil.which(executable)
        if path is None:
            raise RuntimeError(f"{executable} not found on PATH; install Redis (Debian: apt-get install redis-server)")
        self.executable = path
        self.maxmemory = maxmemory
        self.appendfsync = appendfsync
        self.port = 0
        self.dir: Path | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> "RedisServer":
        self.dir = Path(tempfile.mkdtemp(prefix="magic-redis-"))
        for _attempt in range(5):  # a port picked free can be taken before redis binds it
            self.port = free_port()
            self.proc = subprocess.Popen(
                [self.executable, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 *(["--appendonly", "yes", "--appendfsync", self.appendfsync] if self.appendfsync else ["--appendonly", "no"]),
                 "--dir", str(self.dir), "--logfile", str(self.dir / "redis.log"), "--protected-mode", "yes",
                 "--maxmemory", self.maxmemory, "--maxmemory-policy", "noeviction"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=die_with_parent,  # never outlives whoever started it, even killed by SIGKILL
            )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                if answers_at(self.port):
                    return self
                time.sleep(0.05)
            self.proc.kill()
            self.proc.wait()
        raise RuntimeError(f"redis-server did not start (see {self.dir / 'redis.log'})")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
