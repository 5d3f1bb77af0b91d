"""The storage layer: the only package that sends commands to Redis.

Services never hold a Redis client of their own; they get a `RunChannels` (`channels.py`) bound to
one run — its streams, its spec, the step contract — and the controller gets the run stores
(`runs.py`). Each module owns a part of the keys of `magic.protocol.keys`:

    client.py      the Redis client: refused writes retried, retryable errors named
    streams.py     streams and consumer groups: at-least-once delivery, reclaiming, dead letters
    channels.py    one run's channels, as every service uses them
    steps.py       the step contract: who writes which fact of step k (and the learner's commit)
    runs.py        the controller's run state: spec, status, barrier, stages, metrics, filtering
    lease.py       one controller drives a run at a time
    heartbeat.py   worker liveness
    retention.py   stream trimming
    datasets.py    the registered-dataset index
"""
