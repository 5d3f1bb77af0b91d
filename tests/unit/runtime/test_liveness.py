"""LoopWatch: liveness is the main loop coming round, with allowances for known long operations."""

from __future__ import annotations

import pytest

from magic.runtime.liveness import LoopWatch


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_loop_that_comes_round_is_live_and_one_that_stops_is_not():
    clock = Clock()
    w = LoopWatch(10, clock)
    for _ in range(5):
        clock.now += 9
        w.beat()
        assert w.stalled() is None
    clock.now += 10
    assert w.stalled() is None  # exactly the limit is still live
    clock.now += 1
    assert "no progress for 11 s (limit 10 s)" in w.stalled()
    w.beat()
    assert w.stalled() is None  # progress again: live again


def test_an_allowance_covers_a_long_operation_and_only_up_to_its_length():
    clock = Clock()
    w = LoopWatch(10, clock)
    with w.allowing(100, "attaching to run r"):
        clock.now += 100
        assert w.stalled() is None
        clock.now += 1
        assert w.stalled() == "attaching to run r has taken 101 s, over its 100 s"
    assert w.stalled() is None  # its end is progress
    clock.now += 11
    assert w.stalled() is not None  # and the usual limit applies again


def test_an_allowance_ends_as_progress_even_when_the_operation_raises_and_nests():
    clock = Clock()
    w = LoopWatch(10, clock)
    with w.allowing(float("inf"), "waiting for rank 0"):
        clock.now += 1e6
        assert w.stalled() is None
        with pytest.raises(RuntimeError):
            with w.allowing(5, "a command"):
                clock.now += 6
                assert "a command has taken 6 s" in w.stalled()
                raise RuntimeError
        assert w.stalled() is None  # back under the outer allowance
    clock.now += 10
    assert w.stalled() is None


def test_a_non_positive_limit_is_refused():
    with pytest.raises(ValueError):
        LoopWatch(0)
