"""The sandbox's confinement, built from well-kept tools: a bubblewrap root and a seccomp filter.

* `bwrap_argv` — the command that starts a slot's helper (`sandbox_child`) under Debian's
  `bubblewrap`: a read-only root holding only ``/usr`` (and its ``/bin``, ``/lib`` links) and
  the Python installation, ``/proc`` of a new PID namespace, a minimal ``/dev``, private
  tmpfs ``/tmp`` and ``/dev/shm`` (the only writable places), new network, IPC, UTS and cgroup
  namespaces, no capabilities but the few the helper needs to switch to the slot's uid. The
  helper's own source is bound from a copy only root can read.
* `seccomp_bpf` — a seccomp filter compiled with libseccomp (the `pyseccomp` binding) in this
  process; the helper loads it (with ``no_new_privs``) before any test runs, so every program
  and judge inherits it. It refuses (EPERM) namespaces (``unshare``, ``setns``, ``clone`` with a
  namespace flag; ``clone3`` answers ENOSYS so that libc falls back to ``clone``), mounts,
  ``ptrace`` and cross-process memory access, the kernel keyring, ``bpf``,
  ``perf_event_open``, ``userfaultfd``, ``io_uring``, module and kexec loading, and the
  system-wide knobs (clock, swap, reboot, accounting). System calls of another ABI (32-bit
  ``int 0x80``) kill the process.
* `program_seccomp_bpf` — stacked on it in every program's process: no memory the watcher
  cannot see (``memfd_create``, ``memfd_secret``, SysV ``shmget``), no SysV or POSIX IPC
  objects (message queues, semaphore sets, shared memory, ``mq_open``: they live in the slot's IPC
  namespace, which outlives a response, so a sample could leave its answer there for the next
  one, and their kernel memory counts against no limit), no inotify or fanotify watches (a watch on
  a shared read-only file is a channel between concurrent slots, and watches are kernel memory),
  and no file locks (``flock``; ``fcntl`` lock commands), which concurrent samples could signal
  each other through on the read-only files they share.

There is one level of confinement: the service runs as root and bubblewrap can make its
namespaces (CAP_SYS_ADMIN; the chart's reward pod), or the sandbox does not start.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

DENIED_SYSCALLS = (
    "unshare setns mount umount2 pivot_root chroot move_mount open_tree fsopen fsmount fsconfig fspick "
    "mount_setattr ptrace process_vm_readv process_vm_writev kcmp keyctl add_key request_key bpf "
    "perf_event_open userfaultfd io_uring_setup io_uring_enter io_uring_register kexec_load "
    "kexec_file_load init_module finit_module delete_module open_by_handle_at name_to_handle_at "
    "swapon swapoff reboot acct quotactl syslog settimeofday clock_settime clock_adjtime adjtimex "
    "iopl ioperm lookup_dcookie vhangup personality"
).split()
"""Refused with EPERM (see the module docstring)."""
CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
"""CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: clone() with any is refused."""
PROGRAM_DENIED_SYSCALLS = (
    "memfd_create", "memfd_secret", "flock",
    # SysV IPC: message queues, semaphore sets, shared memory
    "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semtimedop", "semctl", "shmget", "shmat", "shmctl", "shmdt",
    # POSIX message queues
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
    # file-system watches
    "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark",
)
"""Refused (EPERM) to programs on top of DENIED_SYSCALLS (see the module docstring)."""
FCNTL_LOCK_COMMANDS = (5, 6, 7, 36, 37, 38)
"""F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW: fcntl() with any is refused to programs."""
HELPER_CAPABILITIES = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_DAC_OVERRIDE", "CAP_FOWNER")
"""What the helper keeps under bubblewrap: switching to the slot's uid, stopping its processes
and removing whatever the program left in its scratch directories. Programs have none."""
HELPER_PATH = "/run/magic/sandbox_child.py"
"""Where the helper's source appears inside the sandbox."""


class ConfinementError(RuntimeError):
    """The requested confinement is not available here; the message says what is missing."""


def _filter():
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as exc:  # OSError: libseccomp.so.2 missing
        raise ConfinementError(f"seccomp needs libseccomp and its Python binding pyseccomp ({exc})") from None
    return sc, sc.SyscallFilter(sc.ALLOW)


def _deny(sc, f, names: Iterable[str]) -> None:
    for name in names:
        try:
            f.add_rule(sc.ERRNO(errno.EPERM), name)
        except (OSError, ValueError, RuntimeError):  # a call this architecture or libseccomp does not know
            continue


def _bpf(f) -> bytes:
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


@lru_cache(maxsize=1)
def seccomp_bpf() -> bytes:
    """The helper's filter as a BPF program (``struct sock_filter[]``), compiled by libseccomp."""
    sc, f = _filter()
    _deny(sc, f, DENIED_SYSCALLS)
    for flag in CLONE_NAMESPACE_FLAGS:
        f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    return _bpf(f)


@lru_cache(maxsize=1)
def program_seccomp_bpf() -> bytes:
    """The filter every program's process adds on top of the helper's (filters stack)."""
    sc, f = _filter()
    _deny(sc, f, PROGRAM_DENIED_SYSCALLS)
    for cmd in FCNTL_LOCK_COMMANDS:
        f.add_rule(sc.ERRNO(errno.EPERM), "fcntl", sc.Arg(1, sc.EQ, cmd))
    return _bpf(f)


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def python_dirs(site_paths: Iterable[str]) -> list[str]:
    """The directories the interpreter needs (its prefixes and site-packages), outside /usr,
    without nesting."""
    dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)), *site_paths) if p}
    dirs = {d for d in dirs if os.path.isdir(d) and not (d == "/usr" or d.startswith("/usr/"))}
    return sorted(d for d in dirs if not any(d != o and d.startswith(o + os.sep) for o in dirs))


def _ancestors(dirs: Iterable[str]) -> list[str]:
    """Every proper ancestor of `dirs` but /, shallowest first.

    >>> _ancestors(["/root/.pyenv/versions/3.11", "/opt/venv"])
    ['/opt', '/root', '/root/.pyenv', '/root/.pyenv/versions']
    """
    out = set()
    for d in dirs:
        parts = d.strip("/").split("/")
        out |= {"/" + "/".join(parts[:k]) for k in range(1, len(parts))}
    return sorted(out, key=lambda p: (p.count("/"), p))


def scratch_entries_kept(site_paths: Iterable[str], scratch_dirs: Iterable[str]) -> list[str]:
    """The entries of the scratch tmpfs that lead to the Python installation (a virtualenv under
    /tmp): made by bubblewrap, root's, kept when the slot is emptied.

    >>> scratch_entries_kept([], ["/tmp"]) == sorted({"/tmp/" + d[len("/tmp/"):].split("/")[0] for d in python_dirs([]) if d.startswith("/tmp/")})
    True
    """
    out = set()
    for d in python_dirs(site_paths):
        for scratch in scratch_dirs:
            if d.startswith(scratch.rstrip("/") + "/"):
                out.add(scratch.rstrip("/") + "/" + d[len(scratch.rstrip("/")) + 1 :].split("/")[0])
    return sorted(out)


def _root_entries() -> list[str]:
    """/usr, and /bin, /lib, /lib64, /sbin: as links where the host has merged /usr, else bound."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib32", "lib64", "libx32", "sbin"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    return args


def bwrap_argv(helper_copy: Path, site_paths: Iterable[str], disk_bytes: int) -> list[str]:
    """The command line that starts a helper under bubblewrap (see the module docstring)."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise ConfinementError("bubblewrap is not installed (Debian: apt-get install bubblewrap)")
    # --die-with-parent follows the *thread* that forks bwrap: start it from a thread that lives
    # as long as the service (`magic.codejudge.sandbox._spawn`), or the helper dies with that thread.
    argv = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    argv += ["--cap-drop", "ALL"]
    for cap in HELPER_CAPABILITIES:
        argv += ["--cap-add", cap]
    argv += ["--hostname", "sandbox"]
    argv += _root_entries()
    argv += ["--proc", "/proc", "--dev", "/dev"]
    # the scratch tmpfs first: the Python installation bound below stays visible when it lives
    # under /tmp (a virtualenv made there)
    argv += ["--perms", "1777", "--size", str(disk_bytes), "--tmpfs", "/tmp"]
    argv += ["--perms", "1777", "--size", str(disk_bytes), "--tmpfs", "/dev/shm"]
    site = list(site_paths)
    dirs = python_dirs(site)
    for ancestor in _ancestors(dirs):  # open on the way (the host's may be 0700, as /root)
        if ancestor not in ("/tmp", "/dev", "/dev/shm"):  # made above, with their own modes
            argv += ["--perms", "0755", "--dir", ancestor]
    for d in dirs:
        argv += ["--ro-bind", d, d]
    for s in site:  # the grader's own package, when installed (not editable) next to the libraries
        if os.path.isdir(os.path.join(s, "magic")):
            argv += ["--tmpfs", os.path.join(s, "magic")]
    argv += ["--ro-bind", str(helper_copy), HELPER_PATH, "--remount-ro", "/", "--chdir", "/tmp"]
    return argv + ["--", os.path.realpath(sys.executable), "-I", "-S", "-B", HELPER_PATH]


def private_copy(source: Path, directory: Path) -> Path:
    """A copy of `source` in `directory` (created mode 0700) that only its owner can read."""
    directory.mkdir(mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    target = directory / source.name
    tmp = directory / f".{source.name}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(source.read_bytes())
    os.replace(tmp, target)
    return target


@lru_cache(maxsize=1)
def bwrap_works() -> str | None:
    """None when bubblewrap can start a confined process here, else why not (container policy:
    no CAP_SYS_ADMIN, a seccomp or AppArmor profile refusing mount)."""
    bwrap = bwrap_path()
    if bwrap is None:
        return "bubblewrap is not installed"
    argv = [bwrap, "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    argv += ["--cap-drop", "ALL"]
    try:
        done = subprocess.run([*argv, "--", "/bin/true"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap did not run: {exc}"
    return None if done.returncode == 0 else f"bubblewrap failed: {done.stderr.decode(errors='replace').strip()[:200]}"
