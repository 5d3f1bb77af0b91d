"""Start a script as W local learner ranks (importable: tests/ is on sys.path): the environment a
launcher gives each rank (RANK, WORLD_SIZE, MASTER_ADDR/PORT on a free port), DeepSpeed's CPU
accelerator and gloo, one thread per rank."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(script, world: int, *args: str) -> list[subprocess.Popen]:
    """`python script *args` as ranks 0..world-1 of one process group, output captured."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script), *map(str, args)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def run_ranks(script, world: int, *args: str, timeout: float = 300) -> list[str]:
    """`start_ranks`, then wait for all of them (all killed past `timeout`); asserts each exited 0
    (the message holds every rank's log tail) and returns their logs."""
    procs = start_ranks(script, world, *args)
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    assert all(p.returncode == 0 for p in procs), "\n".join(x[-4000:] for x in logs)
    return logs
