"""The hard wall-clock bound: calls from any thread, workers killed and replaced."""

from __future__ import annotations

import importlib
import os
import threading
import time

import pytest
from waiting import alive, wait_for

from magic.reward.timeboxed import TimeboxedPool


def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


def huge_power() -> int:
    return 10 ** (10**10)  # one C call that no signal interrupts


def fail() -> None:
    raise KeyError("a message that must not travel")


def die() -> None:
    os._exit(3)


def allocate(mb: int) -> int:
    return len(bytearray(mb * 1024 * 1024))


# The workers import this module when they start (`preload`, outside the bound), as the reward
# service preloads its verifiers: unpickling the first call would import it inside the 1 s bound,
# which a loaded machine does not always meet.
PRELOAD = [__name__]


@pytest.fixture(scope="module")
def pool():
    with TimeboxedPool(workers=2, timeout=1.0, memory_mb=512, preload=PRELOAD) as p:
        yield p


def test_a_call_returns_its_value(pool):
    r = pool.call(slow, 0.01)
    assert r.status == "ok" and r.value == "done"


def test_an_uninterruptible_call_is_killed_at_the_bound_from_a_non_main_thread(pool):
    before = set(pool.pids())
    out = {}

    def call():
        t0 = time.monotonic()
        out["result"] = pool.call(huge_power)
        out["elapsed"] = time.monotonic() - t0

    t = threading.Thread(target=call)
    t.start()
    t.join(30)
    assert out["result"].status == "timeout"
    assert out["elapsed"] < 3.0
    after = set(pool.pids())
    assert len(after) == 2 and before != after  # the overrunning worker was replaced
    assert pool.call(slow, 0).status == "ok"


def test_concurrent_calls_are_bounded_each(pool):
    results = []
    threads = [threading.Thread(target=lambda: results.append(pool.call(slow, 5))) for _ in range(3)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [r.status for r in results] == ["timeout"] * 3
    assert time.monotonic() - t0 < 6  # two at once, then the third: about two bounds, not 15 s


def test_exceptions_come_back_as_their_type_only(pool):
    r = pool.call(fail)
    assert r.status == "error" and r.error == "KeyError"


def test_a_dying_worker_is_replaced(pool):
    assert pool.call(die).status == "crashed"
    assert pool.call(slow, 0).status == "ok"


def test_workers_have_a_memory_limit(pool):
    assert pool.call(allocate, 16).value == 16 * 1024 * 1024
    r = pool.call(allocate, 2048)
    assert r.status == "error" and r.error == "MemoryError"


def test_close_stops_every_worker():
    p = TimeboxedPool(workers=2, timeout=1.0, preload=PRELOAD)
    assert p.call(slow, 0).status == "ok"
    pids = p.pids()
    p.close()
    wait_for(lambda: not any(alive(pid) for pid in pids), 10, "every worker to exit")
    with pytest.raises(RuntimeError):
        p.call(slow, 0)


def act(what: str, arg: float = 0):
    """One call of a batch: "sleep" (then return arg), "hang" (past any bound), "die", "fail"."""
    if what == "sleep":
        return slow(arg) and arg
    if what == "hang":
        return huge_power()
    if what == "die":
        die()
    fail()


def test_a_batch_bounds_each_call_and_goes_on_past_a_killed_worker(pool):
    """call_many: one message to a worker, each call bounded from the end of the one before (so
    five calls of 0.4 s under a 1 s bound all pass), results in order; a call that hangs or kills
    its worker gets its own status and the rest run on a fresh worker."""
    calls = [("sleep", 0.4)] * 5 + [("hang",), ("sleep", 0.1), ("die",), ("sleep", 0.2), ("fail",), ("sleep", 0.3)]
    t0 = time.monotonic()
    results = pool.call_many(act, calls)
    assert [r.status for r in results] == ["ok"] * 5 + ["timeout", "ok", "crashed", "ok", "error", "ok"]
    assert [r.value for r in results if r.status == "ok"] == [0.4] * 5 + [0.1, 0.2, 0.3]
    assert all(r.seconds < 1.0 for r in results if r.status == "ok")
    assert time.monotonic() - t0 < 30  # bounded: 2 s of sleeps, a 1 s kill, the replacements' start-up
    assert pool.call_many(act, []) == []
    assert pool.call(slow, 0).status == "ok"  # the pool is whole again


def test_a_batch_this_worker_cannot_read_is_an_error_for_each_call(pool):
    class Unreadable:  # pickles here; unpickling it in the worker imports a module that does not exist
        def __reduce__(self):
            return importlib.import_module, ("magic_no_such_module",)

    results = pool.call_many(slow, [(0,), (Unreadable(),), (0,)])
    assert [r.status for r in results] == ["error"] * 3 and "cannot unpickle" in results[0].error
    assert pool.call(slow, 0).status == "ok"


class _Unpicklable:
    """Pickles in the worker; unpickling it in the parent raises (ValueError)."""

    def __reduce__(self):
        return int, ("not an int",)


def reply(what: str):
    return _Unpicklable() if what == "bad" else what


def test_a_result_the_parent_cannot_read_is_that_calls_error_and_the_replies_stay_in_step():
    with TimeboxedPool(workers=1, timeout=1.0, preload=PRELOAD) as p:
        results = p.call_many(reply, [("a",), ("bad",), ("b",)])
        assert [r.status for r in results] == ["ok", "error", "ok"] and "unreadable result" in results[1].error
        assert [results[0].value, results[2].value] == ["a", "b"]
        assert p.call(reply, "z").value == "z"  # not a reply owed to the batch before


def test_closing_the_pool_mid_batch_ends_the_batch():
    p = TimeboxedPool(workers=1, timeout=0.5, preload=PRELOAD)
    assert p.call(slow, 0).status == "ok"
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("results", p.call_many(slow, [(2,), (0,)])))
    t.start()
    time.sleep(0.2)
    p.close()
    t.join(20)
    assert not t.is_alive(), "call_many still waits for a worker after close()"
    assert [r.status for r in out["results"]] == ["timeout", "crashed"]
