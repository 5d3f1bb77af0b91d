"""A hard wall-clock bound on a function call, from any thread: run it in a worker process and
kill that process when the bound is reached.

Signal-based timeouts (Math-Verify's own, `signal.alarm`) work only in the main thread and
cannot interrupt long C calls (a big-integer power, a huge factorial); thread-based ones cannot
stop anything. `TimeboxedPool` keeps `workers` long-lived processes; `call(fn, *args)` hands the
call to an idle one and waits at most `timeout` seconds for the answer. A worker that overruns
is killed (SIGKILL) and replaced, and the call returns a `CallResult` with status ``timeout``;
a worker that dies is replaced and the call reports ``crashed``. Callers never see an
exception from the work itself: a raised exception comes back as status ``error`` with the
exception's type name only — never its message, which may embed a huge sympy object.

Workers are plain subprocesses (``python -m magic.reward.timeboxed``) that import `preload`
once (sympy and Math-Verify take about half a second) and then serve calls over a socket; the
bound starts when a ready worker receives the call, so a replacement's start-up is never
counted against a call. Each worker also gets an address-space limit, so one enormous integer
cannot exhaust the pod, and dies with its parent. Concurrency is bounded by the number of
workers; callers beyond it wait their turn.

    pool = TimeboxedPool(workers=2, timeout=5.0, preload=["magic.reward.math.verifier"])
    result = pool.call(math_verifier.verify_magic, response, gold)
    pool.close()
"""

from __future__ import annotations

import json
import logging
import pickle
import queue
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Literal

from magic.runtime.processes import die_with_parent

log = logging.getLogger(__name__)

READY = "ready"
START_TIMEOUT = 120.0
"""Seconds a new worker may take to import its preload modules."""


@dataclass(frozen=True)
class CallResult:
    """How a timeboxed call ended: ``ok`` (with `value`), ``timeout``, ``crashed`` or ``error``."""

    status: Literal["ok", "timeout", "crashed", "error"]
    value: Any = None
    error: str = ""  # the exception's type name for ``error``; what happened otherwise
    seconds: float = 0.0


def worker_main(fd: int, memory_bytes: int, preload: Sequence[str], path: Sequence[str] = ()) -> None:
    """A worker's loop: receive (fn, [args, ...]) and send back, call by call as each ends,
    ("ok", value) or ("error", type name); ("unreadable", why) once for a message it cannot unpickle."""
    import importlib

    die_with_parent(signal.SIGKILL)
    sys.path[:0] = [p for p in path if p not in sys.path]  # import what the parent can
    conn = Connection(fd)
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    for name in preload:
        importlib.import_module(name)
    conn.send(READY)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        except Exception as exc:  # noqa: BLE001 — e.g. a function this process cannot import
            conn.send(("unreadable", f"cannot unpickle the call ({type(exc).__name__})"))
            continue
        if task is None:
            return
        fn, calls = task
        for args in calls:
            try:
                reply = ("ok", fn(*args))
            except BaseException as exc:  # noqa: BLE001 — reported as data, the worker lives on
                reply = ("error", type(exc).__name__)
            try:
                conn.send(reply)
            except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as exc:
                conn.send(("error", f"unsendable result ({type(exc).__name__})"))


class _Worker:
    def __init__(self, memory_bytes: int | None, preload: Sequence[str]):
        mine, theirs = socket.socketpair()
        cmd = [sys.executable, "-m", "magic.reward.timeboxed", str(theirs.fileno()), str(memory_bytes or 0), json.dumps(sys.path), *preload]
        self.proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, close_fds=True)
        theirs.close()
        self.conn = Connection(mine.detach())
        self.ready = False
        self.calls = 0

    def wait_ready(self) -> bool:
        if not self.ready:
            try:
                self.ready = self.conn.poll(START_TIMEOUT) and self.conn.recv() == READY
            except (EOFError, OSError):
                self.ready = False
        return self.ready

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
            self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class TimeboxedPool:
    """`workers` processes running calls with a hard wall-clock bound each (see the module doc)."""

    def __init__(
        self,
        workers: int,
        timeout: float,
        preload: Sequence[str] = (),
        memory_mb: int | None = None,
        recycle_after: int = 5000,
        on_kill: Callable[[], None] | None = None,
    ):
        if workers < 1:
            raise ValueError("a TimeboxedPool needs at least one worker")
        self.timeout = timeout
        self.recycle_after = recycle_after
        self.on_kill = on_kill
        self._memory_bytes = memory_mb * 1024 * 1024 if memory_mb else None
        self._preload = list(preload)
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False
        for _ in range(workers):
            self._idle.put(self._spawn())
        self.size = workers

    def _spawn(self) -> _Worker:
        w = _Worker(self._memory_bytes, self._preload)
        with self._lock:
            self._all.add(w)
        return w

    def _retire(self, w: _Worker, kill: bool) -> None:
        with self._lock:
            self._all.discard(w)
        w.kill() if kill else w.stop()

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> CallResult:
        """Run ``fn(*args)`` in a worker; wait at most `timeout` seconds (default: the pool's)."""
        return self.call_many(fn, [args], timeout=timeout)[0]

    def call_many(self, fn: Callable[..., Any], calls: Sequence[tuple], timeout: float | None = None) -> list[CallResult]:
        """``fn(*args)`` for each args of `calls`, in order, in one worker (another after a kill):
        each call bounded at `timeout` seconds (default: the pool's) from the end of the one before."""
        if self._closed:
            raise RuntimeError("the pool is closed")
        bound = self.timeout if timeout is None else timeout
        results: list[CallResult] = []
        while len(results) < len(calls):
            if self._closed:  # closed mid-batch: no worker will come back to the idle queue
                return results + [CallResult("crashed", error="the pool was closed")] * (len(calls) - len(results))
            results += self._run(self._idle.get(), fn, calls[len(results):], bound)
        return results

    def _run(self, worker: _Worker, fn: Callable[..., Any], calls: Sequence[tuple], bound: float) -> list[CallResult]:
        """Some of `calls`, from the first: all of them, or up to the one that timed out or crashed."""
        out: list[CallResult] = []
        t0 = time.perf_counter()
        replace = kill = False
        try:
            try:
                if not worker.wait_ready():
                    replace = kill = True
                    return [CallResult("crashed", error="worker failed to start", seconds=time.perf_counter() - t0)]
                worker.conn.send((fn, list(calls)))
                t0 = time.perf_counter()
                for _ in calls:
                    if not worker.conn.poll(bound):
                        replace = kill = True
                        if self.on_kill:
                            self.on_kill()
                        out.append(CallResult("timeout", error=f"no answer within {bound:g}s; worker killed", seconds=time.perf_counter() - t0))
                        return out
                    reply = worker.conn.recv_bytes()
                    t1 = time.perf_counter()
                    try:
                        kind, value = pickle.loads(reply)
                    except Exception as exc:  # noqa: BLE001 — a value this process cannot unpickle: this call's error; the replies stay in step
                        kind, value = "error", f"unreadable result ({type(exc).__name__})"
                    if kind == "unreadable":
                        return out + [CallResult("error", error=str(value), seconds=t1 - t0)] * (len(calls) - len(out))
                    worker.calls += 1
                    out.append(CallResult("ok", value=value, seconds=t1 - t0) if kind == "ok" else CallResult("error", error=str(value), seconds=t1 - t0))
                    t0 = t1
            except (EOFError, OSError, BrokenPipeError) as exc:
                replace = kill = True
                out.append(CallResult("crashed", error=f"worker died ({type(exc).__name__})", seconds=time.perf_counter() - t0))
                return out
            except BaseException:  # e.g. KeyboardInterrupt mid-batch: the worker may still owe replies, so it never serves again
                replace = kill = True
                raise
            replace = worker.calls >= self.recycle_after
            return out
        finally:
            if replace:
                self._retire(worker, kill=kill)
                if not self._closed:
                    worker = self._spawn()
            if not self._closed:
                self._idle.put(worker)
            elif not replace:
                self._retire(worker, kill=False)

    def pids(self) -> list[int]:
        """Process ids of the live workers (for tests and diagnostics)."""
        with self._lock:
            return [w.proc.pid for w in self._all]

    def close(self) -> None:
        """Stop every worker (idle ones now; busy ones as their calls end)."""
        self._closed = True
        while True:
            try:
                w = self._idle.get_nowait()
            except queue.Empty:
                break
            self._retire(w, kill=False)

    def __enter__(self) -> "TimeboxedPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    worker_main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[4:], json.loads(sys.argv[3]))
