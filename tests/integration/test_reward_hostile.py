"""Hostile programs are contained and judged wrong, and the sandbox stays healthy afterwards.

Runs only with uid isolation (the service as root, as in the reward image): the containment
claimed here rests on the dedicated uid. The limits are small so that nothing here can strain
the machine: 8 processes per slot, 256 MiB per process, 2 s per test.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from magic.common.config import SandboxSettings
from magic.reward import sandbox_child
from magic.reward.code_verifier import CodeVerifier
from magic.reward.sandbox import Sandbox
from magic.reward.verdict import Status

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
    return f"```python\n{code}\n```"


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
        ("fork bomb", FORK_BOMB, "time limit"),
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
        "__magic_expect__ = lambda i, v: None\n__magic_truth__ = lambda i, v: None\n",
        "import sys\nsys.modules['builtins'].abs = lambda x: 0\n",
    ]
    for patch in patches:
        v, _ = judge(verifier, patch + "def f(x):\n    return 0", truth)
        assert v.status is Status.wrong, (patch, v)
    exits = ["import sys\nsys.exit(0)\ndef f(x):\n    return 42 * x", "import os\nos._exit(0)\ndef f(x):\n    return 42 * x"]
    for code in exits:
        v, _ = judge(verifier, code, truth)
        assert v.status is Status.wrong and "did not run to its end" in v.details, v


def test_the_sandbox_recovers_when_its_helper_is_lost(sandbox, verifier):
    slot = sandbox._slots[0]  # noqa: SLF001
    slot.ensure_helper()
    os.kill(slot.proc.pid, 9)  # as if the helper crashed between runs
    slot.proc.wait()
    assert verifier.verify(fence(SOLVES), ECHO).correct
