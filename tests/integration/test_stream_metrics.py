"""The controller's stream sampler against a real Redis: length, pending, lag and live workers."""

import json
import time

import pytest

from magic.controller.stream_metrics import StreamSampler
from magic.observability import metrics as m
from magic.protocol import keys
from magic.store.channels import RunChannels

pytestmark = pytest.mark.integration


def value(gauge, **labels) -> float:
    return gauge.labels(**labels)._value.get()


def test_sampler_reports_length_pending_lag_and_live_workers(r):
    k = keys.RunKeys("sampled")
    for i in range(5):
        r.xadd(k.prompts, {"i": i})
    r.xgroup_create(k.prompts, "rollout", id="0")
    r.xreadgroup("rollout", "w1", {k.prompts: ">"}, count=3)  # 3 delivered, 2 waiting
    r.xack(k.prompts, "rollout", r.xrange(k.prompts, count=1)[0][0])  # 1 of the 3 acknowledged
    r.xadd(k.dead_of("rollout"), {"x": 1})
    r.set(keys.heartbeat("reward", "reward-0"), json.dumps({"run": "sampled", "at": time.time()}), ex=30)
    r.set(keys.heartbeat("reward", "reward-1"), json.dumps({"run": "another-run", "at": time.time()}), ex=30)

    sampler = StreamSampler(RunChannels(r, "sampled", "controller"), interval=60)
    assert sampler.maybe_sample() is True
    assert value(m.STREAM_LENGTH, stream="prompts") == 5
    assert value(m.STREAM_PENDING, stream="prompts") == 2
    assert value(m.STREAM_LAG, stream="prompts") == 2
    assert value(m.STREAM_LENGTH, stream="dead") == 1
    assert value(m.STREAM_LENGTH, stream="scored") == 0  # not created yet
    assert value(m.LIVE_WORKERS, service="reward") == 1  # only the worker on this run
    assert value(m.LIVE_WORKERS, service="learner") == 0

    r.xreadgroup("rollout", "w1", {k.prompts: ">"})
    assert sampler.maybe_sample() is False  # within the interval: no Redis work
    assert value(m.STREAM_LAG, stream="prompts") == 2
    sampler.sample()
    assert value(m.STREAM_LAG, stream="prompts") == 0
    assert value(m.STREAM_PENDING, stream="prompts") == 4
