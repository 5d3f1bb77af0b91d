"""Run a command in a new, unprivileged user namespace — its root mapped to an unprivileged range of
host uids and gids (as a Kubernetes pod with `hostUsers: false` is) — with mount and PID namespaces
of its own and /proc mounted for them:

    python tests/integration/userns.py HOST_BASE COMMAND [ARG...]

Run as root on the host, which may write the namespace's uid and gid maps itself (no newuidmap,
no /etc/subuid entry). Inside, root holds capabilities over the namespace's own objects only: a
file of the host's root stays out of its reach."""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
MS_REC, MS_PRIVATE = 0x4000, 0x40000
RANGE = 65536


def main() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    base, argv = int(sys.argv[1]), sys.argv[2:]
    to_parent_r, to_parent_w = os.pipe()
    to_child_r, to_child_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(to_parent_r)
        os.close(to_child_w)
        if libc.unshare(CLONE_NEWUSER) != 0:
            os._exit(90)
        os.write(to_parent_w, b"u")  # the parent maps our ids now
        if os.read(to_child_r, 1) != b"m":
            os._exit(93)
        os.setgid(0)
        os.setuid(0)
        if libc.unshare(CLONE_NEWNS | CLONE_NEWPID) != 0:
            os._exit(91)
        libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)
        inner = os.fork()  # the first process of the new PID namespace
        if inner == 0:
            if libc.mount(b"proc", b"/proc", b"proc", 0, None) != 0:
                os._exit(92)
            os.execvp(argv[0], argv)
        _, status = os.waitpid(inner, 0)
        os._exit(os.waitstatus_to_exitcode(status))
    os.close(to_parent_w)
    os.close(to_child_r)
    if os.read(to_parent_r, 1) != b"u":  # the child died before it made its namespace
        _, status = os.waitpid(pid, 0)
        print(f"userns: no user namespace could be made (exit {os.waitstatus_to_exitcode(status)})", file=sys.stderr)
        return 1
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(f"0 {base} {RANGE}\n")
    os.write(to_child_w, b"m")
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
