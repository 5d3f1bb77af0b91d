"""The sandbox's trusted side inside the isolation: one per slot, runs every test in a fresh process.

Started by `magic.reward.sandbox` as ``python -I -S -B sandbox_child.py`` with the standard
library only (nothing of MAGIC is imported here). It never runs untrusted code itself: it sets
up the slot's isolation once, then for every test forks a grandchild that drops privileges,
applies the limits and only then loads the untrusted program. It reads the grandchild's output
and reports it, as data, to the reward process, which compares it with the expected output —
expected outputs never enter the sandbox.

Protocol: one JSON object per line on stdin/stdout.

    -> {"op": "setup", ...}            once: isolation settings        <- {"op": "ready", "applied": {...}}
    -> {"op": "job", ...}              a program and its test kind
    -> {"op": "test", "i": k, ...}     one test                        <- {"op": "result", "i": k, ...}
    -> {"op": "end"}                   job over: kill what is left     <- {"op": "clean", "killed": n}

Test kinds (what the grandchild runs after the LiveCodeBench prelude):

* ``stdin_stdout`` — the program as ``__main__`` with the test input on stdin; reports stdout.
* ``call`` — ``Solution().<fn_name>(*args)`` (or the module-level function) per test; reports
  the return value as plain data (exact built-in types only; anything else is a failure).
* ``assert`` — the program, then the test code (rewritten by the reward process: each
  ``assert expr == <literal>`` reports ``expr`` as plain data, the literal stays outside); every
  function of the program reaches the test through a guard that turns results into plain data,
  so an ``__eq__`` that always returns True never reaches a comparison.
"""

from __future__ import annotations

import builtins
import ctypes
import json
import os
import resource
import select
import signal
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE = 36, 4

PRELUDE_MODULES = (
    "string re datetime collections heapq bisect copy math random statistics itertools functools "
    "operator io sys json typing decimal fractions"
).split()

_libc = ctypes.CDLL(None, use_errno=True)
_write = os.write  # captured before any test runs: the grandchild reports through these
_dumps = json.dumps
_PRISTINE_BUILTINS = dict(vars(builtins))


def _check(ret: int, what: str) -> None:
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, ctypes.c_ulong(flags), data.encode() if data else None),
        f"mount {target}",
    )


# -- isolation (once per slot, as root when the service runs as root) ------------------------


def setup(cfg: dict) -> dict:
    """Apply the slot's isolation; returns what was actually applied."""
    applied: dict = {"uid": None, "network": False, "mounts": False, "ipc": False}
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of a test come back to us to be reaped
    sys.path.extend(p for p in cfg.get("site_paths", []) if p not in sys.path)
    root = os.geteuid() == 0
    workdir = cfg["workdir"]
    # the control directory may sit under /tmp, which is about to be covered: keep a handle
    cfg["control_fd"] = os.open(cfg["control_dir"], os.O_RDONLY | os.O_DIRECTORY)
    if root and cfg.get("namespaces", True):
        flags = CLONE_NEWNS | CLONE_NEWIPC | (CLONE_NEWNET if cfg.get("network_isolation", True) else 0)
        if _libc.unshare(flags) == 0:
            applied["network"] = bool(flags & CLONE_NEWNET)
            applied["ipc"] = True
            _mount("none", "/", None, MS_REC | MS_PRIVATE)
            uid = cfg.get("uid")
            opts = f"size={cfg['disk_bytes']},mode=0700" + (f",uid={uid},gid={cfg['gid']}" if uid is not None else "")
            _mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, opts)
            scratch = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
            for shared in cfg.get("private_tmp_dirs", []):  # /tmp, /var/tmp, /dev/shm -> the slot's tmpfs
                if os.path.isdir(shared):
                    _mount(f"/proc/self/fd/{scratch}", shared, None, MS_BIND)
                    if cfg["workdir"] == workdir:
                        cfg["workdir"] = shared  # the scratch space under a path that still resolves
            os.close(scratch)
            applied["hidden"] = _cover(cfg.get("hidden_paths", []))
            applied["mounts"] = True
    if root and cfg.get("uid") is not None:
        applied["uid"] = cfg["uid"]
    for name in PRELUDE_MODULES:  # imported once here, so every forked test starts warm
        __import__(name)
    applied["workdir"] = cfg["workdir"]
    return applied


def _python_dirs() -> list[str]:
    """The directories the interpreter reads: its prefixes and its import path."""
    dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *sys.path) if p and os.path.isdir(p)}
    return sorted(d for d in dirs if not any(d != o and d.startswith(o + os.sep) for o in dirs))


def _closed_ancestor(path: str) -> str | None:
    """The topmost ancestor of `path` that other users cannot enter (pyenv under a 0700 /root)."""
    parts = path.strip(os.sep).split(os.sep)
    for k in range(1, len(parts)):
        ancestor = os.sep + os.sep.join(parts[:k])
        if not os.stat(ancestor).st_mode & 0o001:
            return ancestor
    return None


def _cover(hidden: list[str]) -> list[str]:
    """Cover each hidden directory, and each closed directory on the way to the interpreter, with
    an empty read-only tmpfs; bind the interpreter's own directories back inside it."""
    python = _python_dirs()
    covers = {os.path.realpath(h) for h in hidden if os.path.isdir(h)}
    covers |= {c for d in python if (c := _closed_ancestor(d))}
    done = []
    for cover in sorted(covers, key=len):
        if any(cover.startswith(c + os.sep) for c in done):
            continue
        keep = [(d, os.open(d, os.O_RDONLY | os.O_DIRECTORY)) for d in python if d.startswith(cover + os.sep)]
        _mount("tmpfs", cover, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
        for d, fd in keep:
            old_umask = os.umask(0o022)
            try:
                os.makedirs(d, mode=0o755, exist_ok=True)
            finally:
                os.umask(old_umask)
            _mount(f"/proc/self/fd/{fd}", d, None, MS_BIND | MS_REC)
            os.close(fd)
        _mount("tmpfs", cover, None, MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_RDONLY, "mode=0755")
        done.append(cover)
    return done


# -- plain data --------------------------------------------------------------------------------

_SCALARS = (type(None), bool, int, float, str)


def plain(value, depth: int = 0):
    """`value` as JSON-able plain data, tagging tuples/sets/dicts/bytes/complex; TypeError for
    anything that is not built from exact built-in types (subclasses included)."""
    if depth > 200:
        raise TypeError("data nested too deeply")
    t = type(value)
    if t in _SCALARS:
        return value
    if t is list:
        return [plain(v, depth + 1) for v in value]
    if t is tuple:
        return {"$t": [plain(v, depth + 1) for v in value]}
    if t is dict:
        return {"$d": [[plain(k, depth + 1), plain(v, depth + 1)] for k, v in value.items()]}
    if t is set or t is frozenset:
        return {"$s" if t is set else "$fs": [plain(v, depth + 1) for v in value]}
    if t is bytes:
        return {"$b": value.hex()}
    if t is complex:
        return {"$c": [value.real, value.imag]}
    if t.__module__ == "numpy" and hasattr(value, "tolist"):  # numpy scalars and arrays
        return plain(value.tolist(), depth + 1)
    raise TypeError(f"not plain data: {t.__name__}")


def plain_copy(value, depth: int = 0):
    """A copy of `value` made of exact built-in types only (TypeError otherwise)."""
    if depth > 200:
        raise TypeError("data nested too deeply")
    t = type(value)
    if t in _SCALARS or t is bytes or t is complex:
        return value
    if t is list or t is tuple or t is set or t is frozenset:
        return t(plain_copy(v, depth + 1) for v in value)
    if t is dict:
        return {plain_copy(k, depth + 1): plain_copy(v, depth + 1) for k, v in value.items()}
    if t.__module__ == "numpy" and hasattr(value, "tolist"):
        return plain_copy(value.tolist(), depth + 1)
    raise TypeError(f"not plain data: {t.__name__}")


# -- the grandchild: one test, untrusted code --------------------------------------------------


def _drop_privileges(limits: dict, uid, gid) -> None:
    os.setsid()
    for sig in (signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as in any Python program: BrokenPipeError
    memory = limits["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    nproc = limits["processes"]
    if uid is None:  # no dedicated uid: the limit counts every process of this user
        nproc += _count_processes(os.getuid())
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    if uid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if os.getresuid() != (uid, uid, uid) or os.getuid() == 0:
            os._exit(121)
    os.chdir(limits["workdir"])
    os.environ.clear()
    os.environ.update(limits["env"])


def _redirect(stdin_fd: int, stdout_fd: int, stderr_fd: int, keep: tuple[int, ...] = ()) -> None:
    os.dup2(stdin_fd, 0)
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    start = 3
    for fd in sorted(keep):
        os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, 1 << 20)
    sys.stdin = open(0, "r", encoding="utf-8", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)


def _report(fd: int, obj: dict) -> None:
    data = (_dumps(obj) + "\n").encode()
    while data:
        data = data[_write(fd, data) :]


def _run_program(job: dict, name: str) -> dict:
    namespace = {"__name__": name, "__builtins__": builtins}
    exec(compile(job["prelude"], "prelude.py", "exec"), namespace)
    exec(compile(job["code"], "solution.py", "exec"), namespace)
    return namespace


def _guard(fn):
    """Hand the test a version of `fn` whose results are plain data (see the module doc)."""
    if not callable(fn) or isinstance(fn, type):
        return fn

    def guarded(*args, **kwargs):
        return plain_copy(fn(*args, **kwargs))

    return guarded


def _grandchild(job: dict, test: dict, report_fd: int) -> int:
    kind = job["kind"]
    if kind == "stdin_stdout":
        try:
            _run_program(job, "__main__")
        except SystemExit:
            pass  # as LiveCodeBench: exit() ends the program normally; its output is judged
        sys.stdout.flush()
        return 0
    if kind == "call":
        ns = _run_program(job, "solution")
        fn_name = job["fn_name"]
        target = ns.get("Solution")
        if isinstance(target, type) and hasattr(target, fn_name):
            fn = getattr(target(), fn_name)
        elif fn_name in ns:
            fn = ns[fn_name]
        else:
            raise NameError(f"the program defines no function {fn_name!r}")
        value = fn(*test["args"])
        if type(value) is tuple:  # LiveCodeBench: a tuple answers for a list
            value = list(value)
        _report(report_fd, {"value": plain(value)})
        return 0
    # assert
    solution = _run_program(job, "solution")
    tests = {"__name__": "__test__", "__builtins__": dict(_PRISTINE_BUILTINS)}
    exec(compile(job["prelude"], "prelude.py", "exec"), tests)
    for k, v in list(solution.items()):
        if not k.startswith("__"):
            tests[k] = _guard(v)

    def expect(i, value):
        _report(report_fd, {"e": i, "v": plain(value)})

    def truth(i, value):
        try:
            ok = bool(plain_copy(value))  # an object with its own __bool__ is not plain data
        except TypeError:
            ok = False
        _report(report_fd, {"t": i, "ok": ok})
        if not ok:
            raise AssertionError(f"assertion {i} failed")

    tests["__magic_expect__"] = expect
    tests["__magic_truth__"] = truth
    exec(compile(test["code"], "test.py", "exec"), tests)
    entry = job.get("entry_point")
    if entry:
        if entry not in solution:
            raise NameError(f"the program defines no {entry!r}")
        tests["check"](_guard(solution[entry]))
    _report(report_fd, {"completed": True})
    return 0


def _start_grandchild(job: dict, test: dict, limits: dict, uid, gid, stdin_path: str | None, control_fd: int):
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # --- the grandchild ---
        code = 1
        try:
            os.close(out_r), os.close(err_r), os.close(rep_r)
            stdin_fd = os.open(stdin_path, os.O_RDONLY, dir_fd=control_fd) if stdin_path else os.open(os.devnull, os.O_RDONLY)
            null = os.open(os.devnull, os.O_WRONLY)
            _redirect(stdin_fd, out_w if job["kind"] == "stdin_stdout" else null, err_w, keep=(rep_w,))
            _drop_privileges(limits, uid, gid)
            code = _grandchild(job, test, rep_w)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # noqa: BLE001 — the traceback tail is the test's detail
            try:
                import traceback

                frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename in ("solution.py", "test.py")]
                sys.stderr.write("".join(traceback.format_list(frames[-3:])) + "".join(traceback.format_exception_only(type(exc), exc)))
                sys.stderr.flush()
            except BaseException:  # noqa: BLE001
                pass
            code = 1
        finally:
            os._exit(code)
    os.close(out_w), os.close(err_w), os.close(rep_w)
    return pid, out_r, err_r, rep_r


MEMORY_CHECK_SECONDS = 0.05


def _collect(pid: int, fds: dict[str, int], limits: dict, owner) -> dict:
    """Read the grandchild's pipes until it exits, the time runs out, the output overflows or its
    processes together hold more than `limits["total_memory_bytes"]` of resident memory."""
    bufs = {name: bytearray() for name in fds}
    open_fds = {fd: name for name, fd in fds.items()}
    deadline = time.monotonic() + limits["test_timeout"]
    max_bytes, max_rss = limits["max_output_bytes"], limits["total_memory_bytes"]
    next_check = time.monotonic() + MEMORY_CHECK_SECONDS
    status = "ok"
    while status == "ok":
        now = time.monotonic()
        if now >= deadline:
            status = "timeout"
            break
        if now >= next_check:
            next_check = now + MEMORY_CHECK_SECONDS
            if resident_bytes(owner) > max_rss:
                status = "memory_limit"
                break
        if not open_fds:
            done, wstatus = os.waitpid(pid, os.WNOHANG)  # output closed: wait for the exit
            if done:
                exit_code, sig = _decode_status(wstatus)
                return {"status": status, "bufs": bufs, "exit": exit_code, "signal": sig, "pid_done": True}
            time.sleep(0.0005)
            continue
        ready, _, _ = select.select(list(open_fds), [], [], min(deadline, next_check) - now)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                os.close(fd)
                del open_fds[fd]
                continue
            name = open_fds[fd]
            buf = bufs[name]
            if name == "stderr":  # keep the tail
                buf += chunk
                del buf[: max(0, len(buf) - 4096)]
            elif len(buf) + len(chunk) > max_bytes:
                buf += chunk[: max(max_bytes - len(buf), 0)]
                status = "output_limit"
            else:
                buf += chunk
    for fd in open_fds:
        os.close(fd)
    return {"status": status, "bufs": bufs, "exit": None, "signal": None, "pid_done": False}


def resident_bytes(owner: tuple[str, int]) -> int:
    """Resident memory of every process of a uid (``("uid", n)``) or session (``("sid", n)``)."""
    kind, ident = owner
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if kind == "uid" and os.stat(f"/proc/{name}").st_uid != ident:
                continue
            if kind == "sid" and os.getsid(int(name)) != ident:
                continue
            with open(f"/proc/{name}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    return total


def _decode_status(wstatus: int) -> tuple[int | None, int | None]:
    if os.WIFSIGNALED(wstatus):
        return None, os.WTERMSIG(wstatus)
    return os.WEXITSTATUS(wstatus), None


# -- cleaning up after a test ------------------------------------------------------------------


def _count_processes(uid: int) -> int:
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


def live_pids(uid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                text = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if fields.get("State", "").strip().startswith("Z"):
            continue
        uids = fields.get("Uid", "").split()
        if uids and int(uids[0]) == uid:
            pids.append(int(name))
    return pids


def kill_uid(uid: int) -> int:
    """SIGKILL every process of `uid` (never root): a helper takes that uid and signals -1."""
    if uid is None or uid <= 0:
        raise ValueError("refusing to kill the processes of root")
    killed = 0
    for _ in range(50):
        pids = live_pids(uid)
        if not pids:
            break
        killed = max(killed, len(pids))
        helper = os.fork()
        if helper == 0:
            try:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                if os.getresuid() == (uid, uid, uid) and os.getuid() != 0:
                    os.kill(-1, signal.SIGKILL)  # every process this uid may signal: its own
            finally:
                os._exit(0)
        os.waitpid(helper, 0)
        _reap()
        time.sleep(0.002)
    return killed


def _kill_session(pid: int) -> None:
    """Without a dedicated uid: kill the grandchild's session (a program that calls setsid() and
    forks escapes this; see the sandbox module's documentation)."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getsid(int(name)) == pid:
                    os.kill(int(name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                pass


def _reap() -> None:
    while True:
        try:
            done, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not done:
            return


def _clean_workdir(workdir: str) -> None:
    import shutil

    for entry in os.scandir(workdir):
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


def _sweep_shared_dirs(uid: int, dirs: list[str]) -> None:
    """Without a mount namespace: delete what the slot's uid left in world-writable directories."""
    import shutil

    for d in dirs:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                pass


# -- the loop ----------------------------------------------------------------------------------


def run_test(job: dict, test: dict, cfg: dict) -> dict:
    limits = dict(job["limits"], workdir=cfg["workdir"], env=cfg["env"])
    uid, gid = cfg.get("uid"), cfg.get("gid")
    stdin_path = None
    if job["kind"] == "stdin_stdout":
        stdin_path = "stdin"
        fd = os.open(stdin_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=cfg["control_fd"])
        with open(fd, "w", encoding="utf-8") as f:
            f.write(test["input"])
    t0 = time.monotonic()
    pid, out_r, err_r, rep_r = _start_grandchild(job, test, limits, uid, gid, stdin_path, cfg["control_fd"])
    fds = {"report": rep_r, "stderr": err_r}
    if job["kind"] == "stdin_stdout":
        fds["stdout"] = out_r
    else:
        os.close(out_r)
    got = _collect(pid, fds, job["limits"], ("uid", uid) if uid is not None else ("sid", pid))
    seconds = time.monotonic() - t0
    if not got["pid_done"]:
        os.kill(pid, signal.SIGKILL)
        _, wstatus = os.waitpid(pid, 0)
        if got["status"] == "ok":
            got["status"] = "timeout"
        got["exit"], got["signal"] = _decode_status(wstatus)
    leftovers = kill_uid(uid) if uid is not None else (_kill_session(pid) or 0)
    _reap()
    bufs = got["bufs"]
    return {
        "op": "result",
        "i": test["i"],
        "status": got["status"],
        "exit": got["exit"],
        "signal": got["signal"],
        "seconds": round(seconds, 6),
        "stdout": bufs.get("stdout", b"").decode("utf-8", "replace"),
        "report": bufs["report"].decode("utf-8", "replace"),
        "stderr": bytes(bufs["stderr"]).decode("utf-8", "replace"),
        "leftovers": leftovers,
    }


class _Gone(Exception):
    """The reward process closed its end."""


def _send(obj: dict) -> None:
    try:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError) as exc:
        raise _Gone from exc


def main() -> int:
    os.umask(0o077)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    cfg: dict = {}
    try:
        _serve(cfg)
    except _Gone:
        pass
    if cfg.get("uid") is not None:  # the service went away: leave nothing behind
        kill_uid(cfg["uid"])
        _reap()
    return 0


def _serve(cfg: dict) -> None:
    job: dict | None = None
    applied: dict = {}
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg.get("op")
        if op == "setup":
            cfg.update(msg)
            applied = setup(cfg)
            _send({"op": "ready", "applied": applied})
        elif op == "job":
            job = msg
        elif op == "test":
            _send(run_test(job, msg, cfg))
        elif op == "end":
            killed = kill_uid(cfg["uid"]) if cfg.get("uid") is not None else 0
            _reap()
            _clean_workdir(cfg["workdir"])
            if cfg.get("uid") is not None and not applied.get("mounts"):
                _sweep_shared_dirs(cfg["uid"], cfg.get("private_tmp_dirs", []))
            job = None
            _send({"op": "clean", "killed": killed})
        elif op == "quit":
            break


if __name__ == "__main__":
    sys.exit(main())
