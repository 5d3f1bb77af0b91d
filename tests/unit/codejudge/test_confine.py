"""The sandbox's confinement as data: the bubblewrap command line and the seccomp program."""

from __future__ import annotations

import doctest
import shutil
import sys

import pytest

from magic.codejudge.sandbox import confine


def test_doctests():
    assert doctest.testmod(confine).failed == 0


def test_the_seccomp_filter_is_a_bpf_program_refusing_the_named_calls():
    bpf = confine.seccomp_bpf()
    assert bpf and len(bpf) % 8 == 0  # struct sock_filter[]
    for name in ("unshare", "mount", "ptrace", "keyctl", "bpf", "perf_event_open", "setns", "io_uring_setup"):
        assert name in confine.DENIED_SYSCALLS
    program = confine.program_seccomp_bpf()  # stacked on it for programs: memory and locks
    assert program and len(program) % 8 == 0 and program != bpf
    assert {"memfd_create", "shmget", "flock"} <= set(confine.PROGRAM_DENIED_SYSCALLS)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (make test installs it)")
def test_the_bubblewrap_command_shows_only_usr_python_and_private_scratch(tmp_path):
    argv = confine.bwrap_argv(tmp_path / "helper.py", [], 1 << 20)
    joined = " ".join(argv)
    for flag in ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--die-with-parent", "--cap-drop ALL", "--proc /proc", "--dev /dev"):
        assert flag in joined, flag
    binds = [argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")]
    python = {sys.prefix, sys.base_prefix, str(tmp_path / "helper.py")}  # the interpreter may live anywhere (a clone under /tmp)
    assert "/" not in binds and not any(b.startswith(("/etc", "/run", "/var", "/home", "/tmp/")) for b in binds if b not in python)
    assert "--bind" not in argv  # nothing of the host is writable
    writable = [argv[i + 1] for i, a in enumerate(argv) if a == "--tmpfs"]
    assert writable[:2] == ["/tmp", "/dev/shm"]
    # the scratch tmpfs come before the Python installation's binds, which stay visible under /tmp
    assert argv.index("/dev/shm") < min(i for i, a in enumerate(argv) if a == "--ro-bind" and argv[i + 1] != "/usr")
    assert [a for a in argv if a.startswith("CAP_")] == list(confine.HELPER_CAPABILITIES)
