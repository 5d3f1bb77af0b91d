"""The sandbox's trusted side inside the isolation: one per slot, runs every test in a fresh process.

Started by `magic.codejudge.sandbox.runner` as ``python -I -S -B sandbox_child.py`` with the standard
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
* ``assert`` — two processes: the program, which only answers calls with plain data (`_answer_calls`),
  and the judge (`_judge`), forked from this helper and out of the program's reach, which runs
  the test code with every name of the program standing for a remote object; the judge alone
  reports the test's completion, so the program can only ever produce data.
"""

from __future__ import annotations

import ast
import builtins
import ctypes
import json
import os
import resource
import select
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 36, 4, 38, 22, 2

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


# -- isolation (once per slot, as root when the service runs as root) ------------------------


def setup(cfg: dict) -> dict:
    """Prepare the slot (bubblewrap already made its root, namespaces and scratch tmpfs): the
    helper reaps every orphan, cannot be inspected, imports the prelude's modules once (every
    forked test starts warm) and loads the seccomp filter every program and judge inherits."""
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of a test come back to us to be reaped
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    sys.path.extend(p for p in cfg.get("site_paths", []) if p not in sys.path)
    if os.geteuid() != 0 or not cfg.get("uid"):
        raise OSError("the helper must run as root and be given the slot's uid")
    for name in PRELUDE_MODULES:
        __import__(name)
    load_seccomp(bytes.fromhex(cfg["seccomp"]))
    cfg["program_bpf"] = bytes.fromhex(cfg["program_seccomp"])
    return {"uid": cfg["uid"], "network": True, "mounts": True, "ipc": True, "pid": True, "bwrap": True, "seccomp": True, "workdir": cfg["workdir"]}


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_seccomp(bpf: bytes) -> None:
    """Set no_new_privs and load a seccomp BPF program (``struct sock_filter[]``, as libseccomp
    exports it) on this process; every process it forks inherits both."""
    if not bpf or len(bpf) % 8:
        raise ValueError("a BPF program is a non-empty array of 8-byte instructions")
    buf = ctypes.create_string_buffer(bpf, len(bpf))
    prog = _SockFprog(len(bpf) // 8, ctypes.cast(buf, ctypes.c_void_p))
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp")


# -- plain data --------------------------------------------------------------------------------

_SCALARS = (type(None), bool, int, float, str)


class WireError(ValueError):
    """A value that crossed between processes is not well-formed plain data."""


def plain(value, depth: int = 0, ref=None):
    """`value` as JSON-able plain data, tagging tuples/sets/dicts/bytes/complex; anything not
    built from exact built-in types (subclasses included) becomes ``ref(value)`` when `ref` is
    given, else a TypeError."""
    if depth > 200:
        raise TypeError("data nested too deeply")
    t = type(value)
    if t in _SCALARS:
        return value
    if t is list:
        return [plain(v, depth + 1, ref) for v in value]
    if t is tuple:
        return {"$t": [plain(v, depth + 1, ref) for v in value]}
    if t is dict:
        return {"$d": [[plain(k, depth + 1, ref), plain(v, depth + 1, ref)] for k, v in value.items()]}
    if t is set or t is frozenset:
        return {"$s" if t is set else "$fs": [plain(v, depth + 1, ref) for v in value]}
    if t is bytes:
        return {"$b": value.hex()}
    if t is complex:
        return {"$c": [value.real, value.imag]}
    if t.__module__ == "numpy" and hasattr(value, "tolist"):  # numpy scalars and arrays
        return plain(value.tolist(), depth + 1, ref)
    if ref is not None:
        return {"$r": ref(value)}
    raise TypeError(f"not plain data: {t.__name__}")


def unplain(obj, depth: int = 0, ref=None, opaque=None):
    """Decode what `plain` made (WireError if malformed); ``{"$r": k}`` becomes ``ref(k)`` when
    `ref` is given. Only exact built-in types come out: decoding runs no code of the sender.

    With `opaque`, sets, bytes and dicts keyed by anything but strings are checked but not built:
    they become ``opaque(kind)``, and nothing the sender chose is hashed — decoding is linear in
    the data's size (a set of integers that all hash alike is quadratic to build). The reward
    process decodes so (`magic.codejudge.cases.from_wire`); the judge builds every type."""
    if depth > 200:
        raise WireError("data nested too deeply")
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if type(obj) is list:
        return [unplain(v, depth + 1, ref, opaque) for v in obj]
    if type(obj) is dict and len(obj) == 1:
        ((tag, v),) = obj.items()
        if tag == "$t" and type(v) is list:
            return tuple(unplain(x, depth + 1, ref, opaque) for x in v)
        if tag in ("$s", "$fs") and type(v) is list:
            items = [unplain(x, depth + 1, ref, opaque) for x in v]
            if opaque is not None:
                return opaque("set" if tag == "$s" else "frozenset")
            try:
                return set(items) if tag == "$s" else frozenset(items)
            except TypeError as exc:
                raise WireError("unhashable set element") from exc
        if tag == "$d" and type(v) is list and all(type(p) is list and len(p) == 2 for p in v):
            if opaque is not None and not all(type(k) is str for k, _ in v):
                for k, x in v:
                    unplain(k, depth + 1, ref, opaque), unplain(x, depth + 1, ref, opaque)
                return opaque("dict with non-string keys")
            try:  # str keys: their hashes are salted per process, so no collision can be forged
                return {unplain(k, depth + 1, ref, opaque): unplain(x, depth + 1, ref, opaque) for k, x in v}
            except TypeError as exc:
                raise WireError("unhashable dict key") from exc
        if tag == "$b" and type(v) is str:
            try:
                data = bytes.fromhex(v)
            except ValueError as exc:
                raise WireError("malformed bytes") from exc
            return opaque("bytes") if opaque is not None else data
        if tag == "$c" and type(v) is list and len(v) == 2 and all(type(x) in (int, float) for x in v):
            return complex(float(v[0]), float(v[1]))
        if tag == "$r" and type(v) is int and ref is not None:
            return ref(v)
    raise WireError(f"not plain data: {type(obj).__name__}")


# -- the grandchild: one test, untrusted code --------------------------------------------------


def _drop_privileges(limits: dict, uid: int, gid: int, program_bpf: bytes) -> None:
    """Become the slot's uid with the program's limits and seccomp filter; raises (and the
    program never runs) if any of it cannot be applied."""
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
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"], limits["processes"]))
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
        raise OSError("could not drop privileges to the slot's uid")
    load_seccomp(program_bpf)
    os.chdir(limits["workdir"])
    os.environ.clear()
    os.environ.update(limits["env"])


def _redirect(stdin_fd: int, stdout_fd: int, stderr_fd: int, keep: tuple[int, ...], remap: dict[int, int]) -> None:
    """Standard streams from the given descriptors, ``remap[k]`` from k, everything else closed."""
    os.dup2(stdin_fd, 0)
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    for src, dst in remap.items():
        os.dup2(src, dst)
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


def _grandchild(job: dict, test: dict, report_fd: int, request_fd: int | None) -> int:
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
    # assert: the program only answers calls; the test runs in the judge (`_judge`)
    prelude = {"__name__": "prelude", "__builtins__": builtins}
    exec(compile(job["prelude"], "prelude.py", "exec"), prelude)
    ns = _run_program(job, "solution")
    _answer_calls(ns, prelude, request_fd, report_fd)
    return 0


# -- assert tests: the program answers calls, the judge runs the test -------------------------
#
# Wire (one JSON object per line). Program -> judge first: {"names": {name: {"call": true} |
# {"module": "m"} | {"value": data}}}: what the program defines. Then per request of the judge
#   {"op": "call", "f": f, "args": [...], "kw": {...}}   {"op": "attr", "f": f, "name": s}
#   {"op": "item", "f": f, "key": data}   {"op": "iter", "f": f}   {"op": "next", "f": f}   {"op": "len", "f": f}
# where f names a top-level name of the program or an object it handed out earlier (a number),
# the program answers {"v": data, "after": [data | null, ...]} (a value; the arguments as the
# call left them), or {"x": [exception class names, most derived first], "msg": str}. Objects
# that are not plain data stay in the program, named by a number ({"$r": k}).

def _describe(ns: dict, prelude: dict) -> dict:
    """What the program defined beyond the prelude, as data."""
    names = {}
    for name, value in ns.items():
        if name.startswith("__") or (name in prelude and prelude[name] is value):
            continue
        if type(value).__name__ == "module":
            names[name] = {"module": value.__name__}
        elif callable(value):
            names[name] = {"call": True}
        else:
            try:
                names[name] = {"value": plain(value)}
            except TypeError:
                names[name] = {"call": True}  # an object: reachable through attribute requests
    return names


def _answer_calls(ns: dict, prelude: dict, request_fd: int, reply_fd: int) -> None:
    """The program's side of an assert test: answer the judge's requests with plain data."""
    objects: list = []

    def ref(value) -> int:
        objects.append(value)
        return len(objects) - 1

    def target(spec):
        return ns[spec] if type(spec) is str else objects[spec]

    _report(reply_fd, {"names": _describe(ns, prelude)})
    requests = os.fdopen(request_fd, "rb", buffering=1 << 16)
    for line in requests:
        req = json.loads(line)
        op = req["op"]
        try:
            args: list = []
            if op == "call":
                args = [unplain(a, ref=objects.__getitem__) for a in req["args"]]
                kw = {k: unplain(v, ref=objects.__getitem__) for k, v in req["kw"].items()}
                value = target(req["f"])(*args, **kw)
            elif op == "attr":
                value = getattr(target(req["f"]), req["name"])
            elif op == "item":
                value = target(req["f"])[unplain(req["key"], ref=objects.__getitem__)]
            elif op == "iter":
                value = iter(target(req["f"]))
            elif op == "next":
                value = next(target(req["f"]))
            else:
                value = len(target(req["f"]))
            after = [plain(a, ref=ref) if type(a) in (list, dict, set) else None for a in args]
            reply = {"v": plain(value, ref=ref), "after": after}
        except BaseException as exc:  # noqa: BLE001 — the judge decides what an exception means
            reply = {"x": [c.__name__ for c in type(exc).__mro__], "msg": str(exc)[:300]}
        _report(reply_fd, reply)


class _Channel:
    """The judge's end of the wire to the program (see above): requests out, plain data back."""

    def __init__(self, request_fd: int, reply_fd: int):
        self.out = request_fd
        self.replies = os.fdopen(reply_fd, "rb", buffering=1 << 16)

    def receive(self) -> dict:
        line = self.replies.readline()
        if not line:
            raise RuntimeError("the program stopped answering (it exited or crashed)")
        try:
            reply = json.loads(line)
        except ValueError as exc:
            raise WireError("the program answered with malformed data") from exc
        if type(reply) is not dict:
            raise WireError("the program answered with malformed data")
        return reply

    def request(self, msg: dict, args: tuple = ()):
        _report(self.out, msg)
        reply = self.receive()
        if "x" in reply:
            raise _exception(reply.get("x"), reply.get("msg"))
        value = unplain(reply.get("v"), ref=self.remote)
        after = reply.get("after") or []
        for arg, state in zip(args, after if type(after) is list else []):
            if state is not None and type(arg) in (list, dict, set):
                new = unplain(state, ref=self.remote)
                if type(new) is type(arg):  # the program changed an argument in place
                    if type(arg) is list:
                        arg[:] = new
                    else:
                        arg.clear()
                        arg.update(new)
        return value

    def remote(self, spec) -> "_Remote":
        return _Remote(self, spec)

    def encode(self, value):
        def ref(v):
            if type(v) is _Remote and type(v._spec) is int:
                return v._spec
            raise TypeError(f"the test passes a {type(v).__name__} to the program: not plain data")

        return plain(value, ref=ref)


def _exception(names, msg) -> BaseException:
    """The first built-in exception class among `names` (the program's exception's classes);
    anything that is not an ``Exception`` (SystemExit, ...) becomes a RuntimeError."""
    for name in names if type(names) is list else []:
        cls = _PRISTINE_BUILTINS.get(name) if type(name) is str else None
        if isinstance(cls, type) and issubclass(cls, Exception):
            return cls(str(msg)[:300])
    return RuntimeError(f"the program raised {str(names)[:80]}: {str(msg)[:200]}")


class _Remote:
    """An object of the program, in the judge: calls, attributes, items, iteration and len()
    are requests; truth and comparisons are not (they would let the program decide)."""

    __slots__ = ("_ch", "_spec")

    def __init__(self, channel: _Channel, spec):
        object.__setattr__(self, "_ch", channel)
        object.__setattr__(self, "_spec", spec)

    def __call__(self, *args, **kwargs):
        ch = self._ch
        msg = {"op": "call", "f": self._spec, "args": [ch.encode(a) for a in args], "kw": {str(k): ch.encode(v) for k, v in kwargs.items()}}
        return ch.request(msg, args)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._ch.request({"op": "attr", "f": self._spec, "name": name})

    def __getitem__(self, key):
        return self._ch.request({"op": "item", "f": self._spec, "key": self._ch.encode(key)})

    def __iter__(self):
        it = self._ch.request({"op": "iter", "f": self._spec})
        if type(it) is not _Remote:
            raise TypeError("iter() of a program's object gave no iterator")
        while True:
            try:
                yield self._ch.request({"op": "next", "f": it._spec})
            except StopIteration:
                return

    def __len__(self) -> int:
        n = self._ch.request({"op": "len", "f": self._spec})
        if type(n) is not int:
            raise TypeError("len() of a program's object is not an int")
        return n

    def __bool__(self) -> bool:
        raise TypeError("the truth of a program's object is not plain data")

    def __repr__(self) -> str:
        return f"<object {self._spec!r} of the program>"



def _judge(job: dict, test: dict, request_fd: int, reply_fd: int, report_fd: int) -> int:
    """The trusted side of an assert test: run the test code, with every name the program
    defined standing for a `_Remote`; report completion only if the code ran to its end.

    The program cannot reach this process (another uid, not dumpable; no ptrace under the
    seccomp filter): all it can do is answer requests with data. The builtins, the prelude's
    names (``isclose``, ``Counter``, ``sqrt``...) and modules keep their own meaning whatever the
    program defines, except for the functions under test (`_under_test`): a program cannot make
    a test's own helpers say what it likes."""
    channel = _Channel(request_fd, reply_fd)
    names = channel.receive().get("names")
    if type(names) is not dict:
        raise WireError("the program did not say what it defines")
    tests = {"__name__": "__test__", "__builtins__": dict(_PRISTINE_BUILTINS)}
    exec(compile(job["prelude"], "prelude.py", "exec"), tests)
    prelude = set(tests) | set(_PRISTINE_BUILTINS)
    under_test = _under_test(test["code"], job.get("entry_point"), {n for n in names if type(n) is str}, prelude)
    for name, desc in names.items():
        if type(name) is not str or type(desc) is not dict or name.startswith("__"):
            continue
        if name in prelude and name not in under_test:
            continue
        if "module" in desc:
            module = sys.modules.get(desc["module"]) if type(desc["module"]) is str else None
            if module is not None:  # only modules already loaded here: the program imports nothing into the judge
                tests[name] = module
        elif "value" in desc:
            tests[name] = unplain(desc["value"])
        else:
            tests[name] = _Remote(channel, name)
    try:
        exec(compile(test["code"], "test.py", "exec"), tests)
        entry = job.get("entry_point")
        if entry:
            if "call" not in names.get(entry, {}):
                raise NameError(f"the program defines no {entry!r}")
            tests["check"](_Remote(channel, entry))
    except AssertionError as exc:
        raise AssertionError(_failed_line(exc, test["code"])) from None
    _report(report_fd, {"completed": True})
    return 0


def _under_test(code: str, entry_point: str | None, defined: set[str], prelude: set[str]) -> set[str]:
    """The program's names a test exercises, and the only ones taken from the program: the entry
    point (HumanEval's ``check(candidate)``); else the names the test code uses that the program
    defines beyond the prelude and the builtins; else (the function under test is named like a
    prelude name or builtin: ``add``, ``median``, ``gcd``) only the innermost calls of such names —
    those whose arguments call no other of them — so that a program defining ``sorted``, ``len``,
    ``abs`` or ``round`` beside ``median`` cannot also take over the test's own helpers around it.

    >>> sorted(_under_test("assert isclose(area(2), 12.56, rel_tol=1e-3)", None, {"area", "isclose"}, {"isclose"}))
    ['area']
    >>> sorted(_under_test("assert add(1, 2) == 3", None, {"add"}, {"add"}))
    ['add']
    >>> sorted(_under_test("def check(c): assert c(1) == 2", "inc", {"inc", "floor"}, {"floor"}))
    ['inc']
    >>> sorted(_under_test("assert abs(median([3, 1, 2]) - 2) < 1e-9", None, {"median", "abs"}, {"median", "abs"}))
    ['median']
    >>> sorted(_under_test("assert math.factorial(5) == factorial(5)", None, {"factorial", "math"}, {"factorial", "math"}))
    ['factorial']
    """
    if entry_point:
        return {entry_point}
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    own = (used & defined) - prelude
    if own:
        return own
    candidates = used & defined
    # a name of the prelude (median, gcd, permutations) is the task's function before a builtin
    # (len, sum, sorted) is: the builtins around it keep their meaning
    named_like_prelude = candidates - set(_PRISTINE_BUILTINS)
    candidates = named_like_prelude or candidates

    def calls(node: ast.AST) -> list[ast.Call]:
        return [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in candidates]

    innermost = {c.func.id for c in calls(tree) if not any(inner is not c for inner in calls(c))}
    return innermost or candidates  # never called by name (map(gcd, ...), f = median): the names themselves


def _failed_line(exc: BaseException, code: str) -> str:
    """The line of the test code where `exc` was raised, for the verdict's details."""
    lineno, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "test.py":
            lineno = tb.tb_lineno
        tb = tb.tb_next
    lines = code.splitlines()
    if lineno is None or not 0 < lineno <= len(lines):
        return str(exc)[:200] or "assertion failed"
    return f"failed at test line {lineno}: {lines[lineno - 1].strip()[:160]}"


def _fork(body, stdin_fd: int, stdout_fd: int, stderr_fd: int, keep: tuple[int, ...], remap: dict[int, int]) -> int:
    """Fork a process that runs ``body()`` with the given standard streams and only the `keep`
    descriptors (``remap`` moves descriptor k to remap[k] first); it exits with body's status
    (1 and a short traceback on an exception)."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        _redirect(stdin_fd, stdout_fd, stderr_fd, keep=keep, remap=remap)
        code = body()
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


def _limit_judge(limits: dict) -> None:
    """The judge runs the ground truth's code: same time and memory limits as the program, and
    nobody may inspect it (not dumpable: /proc/<pid>/mem and ptrace need root)."""
    os.setsid()
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    for sig in (signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))



USAGE_CHECK_SECONDS = 0.05
INODE_BYTES = 1024
"""Kernel memory a file of the scratch tmpfs holds however empty it is (its inode and dentry,
≈ 0.9 KiB): counted as the programs' memory, so that a flood of empty files is bounded by the
memory limit like the bytes they would hold."""
CPU_SLACK_SECONDS = 1.0
"""CPU a test may use beyond `cpu_cores` x its elapsed time (interpreter start-up, bursts)."""


class _Usage:
    """What the slot's programs use together, counted as the kernel charges it: memory is the
    resident memory of every process of the slot's uid plus what its tmpfs (/tmp, /dev/shm)
    hold, their files' inodes included (`INODE_BYTES` each); CPU is the user and system time of every process of the uid, with the time of those
    already reaped (which their parent, or this helper, then carries). A process cannot leave
    its uid, so `setsid()` or a double fork escapes neither."""

    def __init__(self, uid: int, scratch_dirs: list[str]):
        self.uid, self.scratch = uid, scratch_dirs
        self.page, self.tick = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_CLK_TCK")
        self.t0, self.reaped0 = time.monotonic(), self._reaped()

    @staticmethod
    def _reaped() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    def sample(self) -> tuple[int, float]:
        """(memory in bytes, CPU seconds since the test started)."""
        memory, ticks = 0, 0
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                if os.stat(f"/proc/{name}").st_uid != self.uid:
                    continue
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
                fields = stat[stat.rindex(")") + 2 :].split()  # fields[0] is the 3rd field, state
                ticks += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])  # utime stime cutime cstime
                memory += int(fields[21]) * self.page  # rss
            except (OSError, ValueError, IndexError):
                continue
        for d in self.scratch:
            try:
                st = os.statvfs(d)
            except OSError:
                continue
            memory += (st.f_blocks - st.f_bfree) * st.f_frsize + (st.f_files - st.f_ffree) * INODE_BYTES
        return memory, ticks / self.tick + self._reaped() - self.reaped0

    def over(self, limits: dict) -> str | None:
        """"memory_limit" or "cpu_limit" when the programs are over their limits now."""
        memory, cpu = self.sample()
        if memory > limits["total_memory_bytes"]:
            return "memory_limit"
        if cpu > limits["cpu_cores"] * (time.monotonic() - self.t0) + CPU_SLACK_SECONDS:
            return "cpu_limit"
        return None


def _collect(pid: int, fds: dict[str, int], limits: dict, usage: _Usage, until: set[str] | None = None) -> dict:
    """Read the pipes until `pid` exits (after closing the pipes named in `until`, all when
    None), the time runs out, the output overflows or the program's processes together are
    over their memory or CPU (`_Usage`)."""
    bufs = {name: bytearray() for name in fds}
    open_fds = {fd: name for name, fd in fds.items()}
    deadline = time.monotonic() + limits["test_timeout"]
    max_bytes = limits["max_output_bytes"]
    next_check = time.monotonic() + USAGE_CHECK_SECONDS
    status = "ok"
    while status == "ok":
        now = time.monotonic()
        if now >= deadline:
            status = "timeout"
            break
        if now >= next_check:
            next_check = now + USAGE_CHECK_SECONDS
            over = usage.over(limits)
            if over:
                status = over
                break
        if not open_fds or (until is not None and not until & set(open_fds.values())):
            done, wstatus = os.waitpid(pid, os.WNOHANG)  # output closed: wait for the exit
            if done:
                exit_code, sig = _decode_status(wstatus)
                _drain(open_fds, bufs)
                return {"status": status, "bufs": bufs, "exit": exit_code, "signal": sig, "pid_done": True}
            time.sleep(0.0005)
            continue
        ready, _, _ = select.select(list(open_fds), [], [], min(deadline, next_check) - now)
        for fd in ready:
            if not _read_into(fd, open_fds, bufs, max_bytes):
                status = "output_limit"
    for fd in open_fds:
        os.close(fd)
    return {"status": status, "bufs": bufs, "exit": None, "signal": None, "pid_done": False}


def _read_into(fd: int, open_fds: dict[int, str], bufs: dict[str, bytearray], max_bytes: int) -> bool:
    """Read what `fd` has (closing it at its end); False when the output overflowed."""
    chunk = os.read(fd, 65536)
    if not chunk:
        os.close(fd)
        del open_fds[fd]
        return True
    buf = bufs[open_fds[fd]]
    if open_fds[fd] == "stderr":  # keep the tail
        buf += chunk
        del buf[: max(0, len(buf) - 4096)]
    elif len(buf) + len(chunk) > max_bytes:
        buf += chunk[: max(max_bytes - len(buf), 0)]
        return False
    else:
        buf += chunk
    return True


def _drain(open_fds: dict[int, str], bufs: dict[str, bytearray]) -> None:
    """Keep what the still-open pipes hold now (a few reads, never waiting), then close them."""
    for _ in range(16):
        ready, _, _ = select.select(list(open_fds), [], [], 0) if open_fds else ([], [], [])
        if not ready:
            break
        for fd in ready:
            _read_into(fd, open_fds, bufs, 1 << 16)
    for fd in list(open_fds):
        os.close(fd)
        del open_fds[fd]


def _decode_status(wstatus: int) -> tuple[int | None, int | None]:
    if os.WIFSIGNALED(wstatus):
        return None, os.WTERMSIG(wstatus)
    return os.WEXITSTATUS(wstatus), None


# -- cleaning up after a test ------------------------------------------------------------------


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


KILL_WAIT_SECONDS = 10.0
"""How long `kill_uid` waits for the uid's processes to be gone (every one SIGKILLed, again and
again): the scratch space is cleaned only after, so a dying program cannot leave a file behind."""


def kill_uid(uid: int) -> int:
    """SIGKILL every process of `uid` (never root): a helper takes that uid and signals -1."""
    if uid is None or uid <= 0:
        raise ValueError("refusing to kill the processes of root")
    killed = 0
    deadline = time.monotonic() + KILL_WAIT_SECONDS
    for attempt in range(1_000_000):
        pids = live_pids(uid)
        if not pids or (attempt >= 50 and time.monotonic() > deadline):
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
        time.sleep(0.002 if attempt < 50 else 0.05)  # a loaded machine: a killed process may take a while to go
    return killed


def _reap() -> None:
    while True:
        try:
            done, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not done:
            return


def _clean_workdir(workdir: str, keep: frozenset[str] = frozenset()) -> None:
    """Empty `workdir` but for the `keep` paths (the way to a Python installation bound into the
    sandbox's /tmp: root's, read-only, never the program's)."""
    import shutil

    for entry in os.scandir(workdir):
        if entry.path in keep:
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


# -- the loop ----------------------------------------------------------------------------------


def _stdin(text: str | None) -> int:
    """A descriptor to read `text` from (an anonymous memory file; /dev/null when None)."""
    if text is None:
        return os.open(os.devnull, os.O_RDONLY)
    fd = os.memfd_create("stdin", 0)
    data = text.encode("utf-8")
    while data:
        data = data[os.write(fd, data) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def run_test(job: dict, test: dict, cfg: dict) -> dict:
    """Run one test: the program in a fresh process with the slot's identity and limits; for an
    assert test also the judge, in a fresh process the program cannot reach."""
    limits = dict(job["limits"], workdir=cfg["workdir"], env=cfg["env"])
    uid, gid, kind = cfg["uid"], cfg["gid"], job["kind"]
    stdin_fd = _stdin(test["input"] if kind == "stdin_stdout" else None)
    usage = _Usage(uid, cfg["scratch_dirs"])
    null = os.open(os.devnull, os.O_WRONLY)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    rep_r, rep_w = os.pipe()
    t0 = time.monotonic()
    if kind == "assert":
        req_r, req_w = os.pipe()
        ans_r, ans_w = os.pipe()

        def program() -> int:
            _drop_privileges(limits, uid, gid, cfg["program_bpf"])
            return _grandchild(job, test, 3, 4)

        def judge() -> int:
            _limit_judge(limits)
            return _judge(job, test, 3, 4, 5)

        os.dup2(ans_w, 103), os.dup2(req_r, 104)  # the program's reply (3) and request (4) ends
        pid = _fork(program, stdin_fd, null, err_w, keep=(3, 4), remap={103: 3, 104: 4})
        os.dup2(req_w, 103), os.dup2(ans_r, 104), os.dup2(rep_w, 105)
        judge_pid = _fork(judge, stdin_fd, null, err_w, keep=(3, 4, 5), remap={103: 3, 104: 4, 105: 5})
        for fd in (103, 104, 105, req_r, req_w, ans_r, ans_w):
            os.close(fd)
    else:

        def program() -> int:
            _drop_privileges(limits, uid, gid, cfg["program_bpf"])
            return _grandchild(job, test, 3, None)

        os.dup2(rep_w, 103)
        pid = _fork(program, stdin_fd, out_w if kind == "stdin_stdout" else null, err_w, keep=(3,), remap={103: 3})
        os.close(103)
        judge_pid = None
    for fd in (stdin_fd, null, out_w, err_w, rep_w):
        os.close(fd)
    fds = {"report": rep_r, "stderr": err_r}
    if kind == "stdin_stdout":
        fds["stdout"] = out_r
    else:
        os.close(out_r)
    waited = judge_pid or pid
    got = _collect(waited, fds, job["limits"], usage, until={"report"} if judge_pid else None)
    seconds = time.monotonic() - t0
    if not got["pid_done"]:
        os.kill(waited, signal.SIGKILL)
        _, wstatus = os.waitpid(waited, 0)
        if got["status"] == "ok":
            got["status"] = "timeout"
        got["exit"], got["signal"] = _decode_status(wstatus)
    if judge_pid:  # the program's part is over: it answers no more calls
        _end(pid, grace=0.2)
    leftovers = kill_uid(uid)
    _reap()
    bufs = got["bufs"]
    header = {"op": "result", "i": test["i"], "status": got["status"], "exit": got["exit"], "signal": got["signal"]}
    header.update(seconds=round(seconds, 6), leftovers=leftovers)
    return header, {name: bytes(bufs.get(name, b"")) for name in ("stdout", "report", "stderr")}


def _end(pid: int, grace: float) -> None:
    """Let `pid` exit within `grace` seconds (it has seen the end of its input), else kill it."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.001)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


class _Gone(Exception):
    """The reward process closed its end."""


def _send(obj: dict, blobs: dict[str, bytes] | None = None) -> None:
    """One reply: a JSON header line, then the raw bytes of `blobs`, their sizes in the header
    (the program's output is never escaped into JSON: it crosses as it was written)."""
    blobs = blobs or {}
    header = dict(obj, blobs=[[name, len(data)] for name, data in blobs.items()])
    try:
        out = sys.stdout.buffer
        out.write((json.dumps(header) + "\n").encode())
        for data in blobs.values():
            out.write(data)
        out.flush()
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
    if cfg.get("uid"):  # the service went away: leave nothing behind
        kill_uid(cfg["uid"])
        _reap()
    return 0


def _serve(cfg: dict) -> None:
    job: dict | None = None
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg.get("op")
        if op == "setup":
            cfg.update(msg)
            try:
                applied = setup(cfg)
            except Exception as exc:  # noqa: BLE001 — the reward process says why the slot cannot start
                _send({"op": "failed", "error": f"{type(exc).__name__}: {exc}"[:500]})
                return
            _send({"op": "ready", "applied": applied})
        elif op == "job":
            job = msg
        elif op == "test":
            _send(*run_test(job, msg, cfg))
        elif op == "end":  # whatever the program did: no process of the uid, empty scratch space
            killed = kill_uid(cfg["uid"])
            _reap()
            for scratch in cfg["scratch_dirs"]:
                _clean_workdir(scratch, frozenset(cfg.get("keep", ())))
            job = None
            _send({"op": "clean", "killed": killed})
        elif op == "quit":
            break


if __name__ == "__main__":
    sys.exit(main())
