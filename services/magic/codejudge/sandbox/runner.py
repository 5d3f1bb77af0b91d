"""Running untrusted programs: what the sandbox isolates, what it does not, and how.

Every test runs in a fresh process, forked for it by the slot's helper (`magic.codejudge.sandbox.child`,
a trusted program of the standard library only), which then drops privileges and applies the
limits before the untrusted code is loaded. The reward process compares the output; the
program only ever reports data, and never sees the expected output.

**One level of isolation**, whatever the deployment: the service runs as root with
CAP_SYS_ADMIN (the chart's code judge pod, Pod Security "privileged"), every slot's helper starts
under bubblewrap with a seccomp filter, and its programs run as the slot's own uid. Where any of
it is missing the sandbox refuses to start (`SandboxError`, and code answers get the verdict
`error`); it never judges untrusted code less confined.

* *identity* — each slot's programs run as a dedicated unprivileged uid/gid (``uid_base`` + k,
  no supplementary groups), claimed through a lock file, so nothing else runs as it. They cannot
  signal, trace or read the memory or environment of the service, its helper, the judge or other
  slots, and cannot write anywhere but their slot's tmpfs;
* *root* (`magic.codejudge.sandbox.confine`) — a minimal read-only root holding only ``/usr`` and
  the Python installation, new PID, network (no interface up), IPC, UTS and cgroup namespaces,
  private tmpfs ``/tmp`` and ``/dev/shm`` of ``disk_mb`` each, emptied after every response
  whatever the program did;
* *system calls* — a libseccomp filter (no namespaces, mounts, ptrace, keyrings, bpf,
  perf_event_open, io_uring) with no_new_privs, and for programs also no ``memfd_create``,
  SysV shared memory or file locks;
* *processes* — RLIMIT_NPROC counts the slot's uid only, so a fork bomb stops at ``processes``;
  after every test every process of the uid is killed, ``setsid()`` daemons included; the helper
  is a child subreaper, so every orphan is reaped;
* *resources* — per process: address space (``memory_mb``), CPU seconds, file size, open files,
  no core dumps; per test, over every process of the uid: wall-clock time, bytes of output,
  memory (resident memory plus what the slot's tmpfs hold, over ``total_memory_mb``) and CPU
  (more than ``cpu_cores`` x the elapsed time: `cpu_limit`), so one sample cannot starve
  another slot's;
* *environment* — scrubbed: a fixed PATH, HOME and TMPDIR in /tmp, one thread for BLAS.

**Verdicts**: the program's process produces only data; the helper sends it back framed by
length, and the reward process decodes it in linear time into values compared with the
expected output (`magic.codejudge.cases`). An assert test's code runs in a judge process forked
by the helper, which the program reaches only through a data-only request/answer channel; the
test's prelude names keep their own meaning there.

**Not isolated**: the kernel is shared (the seccomp filter narrows it; for a second kernel
boundary run the pod under gVisor or Kata: the chart's ``reward.runtimeClassName``); CPU caches
and memory bandwidth are shared, so timings are noisy under load; memory is watched every
50 ms, not capped, so a burst faster than that can reach ``processes`` x ``memory_mb``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import pwd
import queue
import selectors
import site
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from magic.codejudge.sandbox import child, confine
from magic.codejudge.settings import SandboxSettings

log = logging.getLogger(__name__)

CHILD = Path(child.__file__)
SCRATCH_DIRS = ("/tmp", "/dev/shm")
"""The slot's private tmpfs, emptied after every response."""
GRACE_SECONDS = 5.0
"""How much longer than a test's limit the helper may take to answer before it is replaced."""
LCB_PRELUDE = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\nfrom heapq import *\n"
    "from bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\nfrom statistics import *\n"
    "from itertools import *\nfrom functools import *\nfrom operator import *\nfrom io import *\nfrom sys import *\n"
    "from json import *\nfrom builtins import *\nfrom typing import *\nimport string\nimport re\nimport datetime\n"
    "import collections\nimport heapq\nimport bisect\nimport copy\nimport math\nimport random\nimport statistics\n"
    "import itertools\nimport functools\nimport operator\nimport io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\n"
)
"""Prepended to every program, as LiveCodeBench does: the names competitive code assumes."""
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program): misconfiguration or a broken helper."""


@dataclass(frozen=True)
class TestRun:
    """What one test of a program did. The program's output is data, compared by the caller."""

    index: int
    status: str  # "ok" (ran to its end), "timeout", "output_limit", "memory_limit", "cpu_limit", "crashed" (signal or exit != 0)
    stdout: str = ""  # stdin_stdout tests
    report: str = ""  # call / assert tests: JSON lines the program's harness reported
    stderr: str = ""  # the tail, for details
    exit_code: int | None = None
    signal: int | None = None
    seconds: float = 0.0
    leftovers: int = 0  # processes still alive after the test, killed


@dataclass
class SandboxResult:
    """A program's run over its tests (stopped at the first test the judge rejects)."""

    tests: list[TestRun] = field(default_factory=list)
    passed: bool = False
    stopped: str = ""  # why the run stopped early ("test 3 failed", "total time limit", ...)
    seconds: float = 0.0
    killed: int = 0  # processes killed after tests (daemons, fork bombs)
    error: str | None = None  # a sandbox failure (not the program's): the verdict is ERROR


@dataclass(frozen=True)
class Program:
    """An untrusted program and how its tests call it."""

    kind: str  # "stdin_stdout" | "call" | "assert"
    code: str
    fn_name: str | None = None  # call
    entry_point: str | None = None  # assert (HumanEval's check(candidate))


# -- slots ---------------------------------------------------------------------------------------


def _prepare_root(root: Path) -> Path:
    """The sandbox's directory: created with mode 0711, owned by us, not a symlink."""
    root.mkdir(mode=0o711, parents=True, exist_ok=True)
    st = root.lstat()
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():
        raise SandboxError(f"{root} must be a directory owned by uid {os.geteuid()} (not a symlink)")
    os.chmod(root, 0o711)
    (root / "locks").mkdir(mode=0o711, exist_ok=True)
    return root


def _site_paths() -> list[str]:
    paths = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    return [p for p in paths if os.path.isdir(p)]


def kill_uid(uid: int) -> int:
    """SIGKILL every process of the (non-root) `uid`, from a helper process that takes that uid."""
    if uid <= 0:
        raise ValueError("refusing to kill the processes of root")
    killed = 0
    for _ in range(50):
        pids = child.live_pids(uid)
        if not pids:
            return killed
        killed = max(killed, len(pids))
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", "import os, signal\nif os.getuid() != 0: os.kill(-1, signal.SIGKILL)"],
            user=uid,
            group=uid,
            extra_groups=[],
            env={},
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.01)
    raise SandboxError(f"processes of uid {uid} survive SIGKILL")


# Helpers are started from one thread that lives as long as this process. bubblewrap's
# --die-with-parent is PR_SET_PDEATHSIG, which fires when the *thread* that forked it exits, not
# the process: a helper started from a short-lived thread (the service's warm-up thread, an HTTP
# handler, a pool worker that retires) was killed with it, in the middle of whatever test it ran.
_spawner_lock = threading.Lock()
_spawner: tuple[int, queue.SimpleQueue] | None = None  # (pid, requests)


def _spawn_loop(requests: queue.SimpleQueue) -> None:
    while True:
        argv, kwargs, reply = requests.get()
        try:
            reply.put((True, subprocess.Popen(argv, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 — raised again in the caller's thread
            reply.put((False, exc))


def _spawn(argv: list[str], **kwargs) -> subprocess.Popen:
    """`subprocess.Popen(argv, **kwargs)`, run by this process's long-lived spawner thread."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner[0] != os.getpid():  # none yet, or we are a forked child
            requests: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_spawn_loop, args=(requests,), name="sandbox-spawner", daemon=True).start()
            _spawner = (os.getpid(), requests)
        requests = _spawner[1]
    reply: queue.SimpleQueue = queue.SimpleQueue()
    requests.put((argv, kwargs, reply))
    ok, value = reply.get()
    if not ok:
        raise value
    return value


def _after_fork_in_child() -> None:
    global _spawner_lock, _spawner
    _spawner_lock, _spawner = threading.Lock(), None


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Slot:
    """One unit of concurrency: a uid, a helper process and its private scratch tmpfs."""

    def __init__(self, index: int, settings: SandboxSettings, uid: int, lock_fd: int, confinement: dict):
        self.index = index
        self.settings = settings
        self.confinement = confinement  # {"bwrap": argv, "seccomp": bytes, "program_seccomp": bytes}
        self.uid = uid
        self.lock_fd = lock_fd
        self.proc: subprocess.Popen | None = None
        self.applied: dict = {}
        self._buf = bytearray()

    # -- the helper ------------------------------------------------------------------------
    def ensure_helper(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.stop_helper()
        s = self.settings
        self.proc = _spawn(self.confinement["bwrap"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(SANDBOX_ENV), cwd="/", start_new_session=True)
        self._buf = bytearray()
        setup = {
            "op": "setup",
            "uid": self.uid,
            "gid": self.uid,
            "workdir": "/tmp",
            "scratch_dirs": list(SCRATCH_DIRS),
            "keep": confine.scratch_entries_kept(_site_paths(), SCRATCH_DIRS),
            "seccomp": self.confinement["seccomp"].hex(),
            "program_seccomp": self.confinement["program_seccomp"].hex(),
            "disk_bytes": s.disk_mb * 1024 * 1024,
            "site_paths": _site_paths(),
            "env": dict(SANDBOX_ENV, HOME="/tmp", TMPDIR="/tmp"),
        }
        reply = self.request(setup, time.monotonic() + 60)
        if reply is None or reply.get("op") != "ready":
            why = reply.get("error") if reply else None
            self.stop_helper()
            raise SandboxError(f"the sandbox helper did not start{f': {why}' if why else ''}")
        self.applied = reply["applied"]

    def stop_helper(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.proc = None
        kill_uid(self.uid)

    def request(self, msg: dict, deadline: float) -> dict | None:
        """Send one message and read one reply before `deadline`; None if none came.

        A reply is a JSON header line, then the raw bytes of the blobs it lists
        (``"blobs": [[name, size], ...]``), which become str fields of the reply: the program's
        output crosses as bytes, read in linear time, never as escaped JSON."""
        assert self.proc is not None
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        if msg["op"] == "job":
            return {}
        line = self._read_until(deadline, line=True)
        if line is None:
            return None
        try:
            reply = json.loads(line)
        except ValueError:
            return None
        if type(reply) is not dict:
            return None
        blobs = reply.pop("blobs", [])
        for name, size in blobs:
            data = self._read_until(deadline, size=int(size))
            if data is None:
                return None
            reply[name] = data.decode("utf-8", "replace")
        return reply

    def _read_until(self, deadline: float, line: bool = False, size: int = 0) -> bytes | None:
        """The next line (without its newline) or the next `size` bytes from the helper; None if
        they did not come before `deadline`. Each byte is scanned once."""
        fd = self.proc.stdout.fileno()
        scanned = 0
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                if line:
                    at = self._buf.find(b"\n", scanned)
                    if at >= 0:
                        out = bytes(self._buf[:at])
                        del self._buf[: at + 1]
                        return out
                    scanned = len(self._buf)
                elif len(self._buf) >= size:
                    out = bytes(self._buf[:size])
                    del self._buf[:size]
                    return out
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return None
                self._buf += chunk

    def close(self) -> None:
        self.stop_helper()
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


# -- the sandbox -------------------------------------------------------------------------------


class Sandbox:
    """A pool of `settings.slots` slots; `run` executes one program's tests in a free slot."""

    def __init__(self, settings: SandboxSettings, on_kill: Callable[[str, int], None] | None = None):
        self.settings = settings
        self.on_kill = on_kill or (lambda reason, n: None)
        self.confinement = self._confinement(settings)
        self.root = Path(settings.root)
        self._free: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        self._slots: list[_Slot] = []
        uids = iter(range(settings.uid_base, settings.uid_base + settings.uid_count))
        for k in range(settings.slots):
            uid, fd = self._claim_uid(uids)
            slot = _Slot(k, settings, uid, fd, self.confinement)
            self._slots.append(slot)
            self._free.put(slot)

    @staticmethod
    def _confinement(settings: SandboxSettings) -> dict:
        """The one confinement the sandbox runs with, or SandboxError saying what is missing."""
        if not settings.enabled:
            raise SandboxError("the code sandbox is turned off (MAGIC_SANDBOX__ENABLED=false): this code judge runs no program")
        missing = []
        if os.geteuid() != 0:
            missing.append("the service runs as uid %d, not root (it gives every slot its own uid)" % os.geteuid())
        try:
            seccomp, program_seccomp = confine.seccomp_bpf(), confine.program_seccomp_bpf()
        except confine.ConfinementError as exc:
            missing.append(str(exc))
        if not missing:
            why = confine.bwrap_works()
            if why is not None:
                missing.append(f"{why} (bubblewrap needs CAP_SYS_ADMIN and a seccomp/AppArmor profile that allows mount: the chart's code judge pod under Pod Security \"privileged\")")
        if missing:
            raise SandboxError("the code sandbox cannot start, so code answers are not judged: " + "; ".join(missing))
        helper = confine.private_copy(CHILD, _prepare_root(settings.root) / "helper")
        bwrap = confine.bwrap_argv(helper, _site_paths(), settings.disk_mb * 1024 * 1024)
        return {"bwrap": bwrap, "seccomp": seccomp, "program_seccomp": program_seccomp}

    def _claim_uid(self, uids: Iterable[int]) -> tuple[int, int]:
        """The next uid of the range that no account owns, no other sandbox holds (lock file)
        and no process runs as."""
        for uid in uids:
            try:
                pwd.getpwuid(uid)
                continue  # a real account: never ours
            except KeyError:
                pass
            fd = os.open(self.root / "locks" / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            if child.live_pids(uid):
                log.warning("uid %d has running processes; not using it for the sandbox", uid)
                os.close(fd)
                continue
            return uid, fd
        raise SandboxError(f"no free sandbox uid in [{self.settings.uid_base}, {self.settings.uid_base + self.settings.uid_count})")

    def describe(self) -> dict:
        """The isolation in force (what the first helper to start reported applying)."""
        applied = [s.applied for s in self._slots if s.applied]
        return {"isolation": "bwrap+uid+seccomp", "slots": len(self._slots), "applied": applied[0] if applied else None}

    def warm_up(self) -> None:
        """Start every slot's helper now (otherwise the first run of a slot starts it)."""
        for slot in self._slots:
            slot.ensure_helper()

    def run(
        self,
        program: Program,
        tests: list[dict],
        judge: Callable[[dict, TestRun], bool],
        time_limit: float | None = None,
    ) -> SandboxResult:
        """Run `program` on `tests` in order, stopping at the first one `judge` rejects.

        `tests` are the inputs only (``{"input": str}``, ``{"args": list}`` or ``{"code": str}``);
        `judge(test, run)` decides in this process whether a test passed. `time_limit` overrides
        the per-test wall-clock limit."""
        s = self.settings
        per_test = time_limit or s.test_timeout_seconds
        limits = {
            "test_timeout": per_test,
            "cpu_seconds": int(per_test) + 1,
            "memory_bytes": s.memory_mb * 1024 * 1024,
            "file_bytes": s.file_mb * 1024 * 1024,
            "open_files": s.open_files,
            "processes": s.processes,
            "max_output_bytes": int(s.max_output_mb * 1024 * 1024),
            "total_memory_bytes": s.total_memory_mb * 1024 * 1024,
            "cpu_cores": s.cpu_cores,
        }
        job = {
            "op": "job",
            "kind": program.kind,
            "code": program.code,
            "prelude": LCB_PRELUDE,
            "fn_name": program.fn_name,
            "entry_point": program.entry_point,
            "limits": limits,
        }
        slot = self._free.get()
        result = SandboxResult()
        t0 = time.monotonic()
        try:
            self._run_in_slot(slot, job, tests, judge, per_test, t0 + s.total_timeout_seconds, result)
        except SandboxError as exc:
            result.error = str(exc)
        finally:
            result.seconds = time.monotonic() - t0
            self._free.put(slot)
        return result

    def _run_in_slot(self, slot: _Slot, job: dict, tests: list[dict], judge, per_test: float, total_deadline: float, result: SandboxResult) -> None:
        slot.ensure_helper()
        try:
            slot.request(job, time.monotonic() + 10)
            self._run_tests(slot, tests, judge, per_test, total_deadline, result)
        finally:  # whatever ended the run (a failed test, a judge that raised, a dead helper): clean the slot
            reply = slot.request({"op": "end"}, time.monotonic() + 30) if slot.proc is not None else None
            if reply is None or reply.get("op") != "clean":
                slot.stop_helper()  # a new helper starts with empty scratch space and no process of the uid
                if result.error is None and sys.exc_info()[0] is None:
                    raise SandboxError("the sandbox helper did not clean up")
            elif reply.get("killed"):
                result.killed += int(reply["killed"])
                self.on_kill("leftover_processes", int(reply["killed"]))

    def _run_tests(self, slot: _Slot, tests: list[dict], judge, per_test: float, total_deadline: float, result: SandboxResult) -> None:
        result.passed = True
        for i, test in enumerate(tests):
            if time.monotonic() > total_deadline:
                result.passed, result.stopped = False, f"total time limit ({self.settings.total_timeout_seconds:g}s) reached before test {i}"
                self.on_kill("total_timeout", 0)
                return
            reply = slot.request({"op": "test", "i": i, **test}, time.monotonic() + per_test + GRACE_SECONDS)
            if reply is None or reply.get("op") != "result":
                slot.stop_helper()
                raise SandboxError(f"the sandbox helper stopped answering during test {i}")
            run = TestRun(
                index=i,
                status=_status(reply),
                stdout=reply.get("stdout", ""),
                report=reply.get("report", ""),
                stderr=reply.get("stderr", ""),
                exit_code=reply.get("exit"),
                signal=reply.get("signal"),
                seconds=float(reply.get("seconds", 0.0)),
                leftovers=int(reply.get("leftovers", 0)),
            )
            result.tests.append(run)
            if run.status in ("timeout", "memory_limit", "cpu_limit"):
                self.on_kill("test_timeout" if run.status == "timeout" else run.status, 1)
            if run.leftovers:
                result.killed += run.leftovers
                self.on_kill("leftover_processes", run.leftovers)
            try:
                passed = judge(test, run)
            except Exception as exc:  # noqa: BLE001 — output the judge cannot read is a failed test, never the sandbox's error
                log.debug("judging test %d raised %s", i, exc)
                passed = False
            if not passed:
                result.passed, result.stopped = False, f"test {i} failed"
                return

    def close(self) -> None:
        for slot in self._slots:
            slot.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _status(reply: dict) -> str:
    status = reply.get("status", "crashed")
    if status == "ok" and (reply.get("signal") is not None or reply.get("exit") not in (0, None)):
        return "crashed"
    return status
