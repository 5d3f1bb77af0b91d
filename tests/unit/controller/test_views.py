"""The run view's throughput: steps that overlap (bounded staleness) are counted once."""

from __future__ import annotations

import pytest

from magic.controller.api.views import throughput


def test_throughput_counts_overlapping_steps_once():
    # barrier steps of 10 s recorded 12 s apart (a validation between): the steps' own 30 s
    barrier = [{"time": 100.0 + 12 * i, "step_seconds_total": 10.0, "samples": 8, "response_length_mean": 5.0} for i in range(3)]
    assert throughput(barrier).steps_per_hour == pytest.approx(3600 * 3 / 30)
    # s = 1: each step spans 10 s from its publication to its record, recorded 5 s apart: 20 s in all, not 30
    overlapped = [{"time": 100.0 + 5 * i, "step_seconds_total": 10.0, "samples": 8, "response_length_mean": 5.0} for i in range(3)]
    got = throughput(overlapped)
    assert got.steps_per_hour == pytest.approx(3600 * 3 / 20) and got.samples_per_second == pytest.approx(24 / 20)
    assert throughput([{"step_seconds_total": 4.0, "samples": 2}]).steps_per_hour == pytest.approx(900)  # no time: the durations
