"""Shared fixtures: a private redis-server, a Redis client wiped per test, a tiny random model;
and the order the suite runs in."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

LONGEST_FIRST = (
    "tests/integration/test_vllm_engine.py",  # three vLLM starts in one test, ~4 min mostly waiting
    "tests/e2e/test_local.py",
    "tests/deploy/test_images.py",  # image builds: mostly waiting on the package registries
    "tests/e2e/test_faults.py",
    "tests/integration/test_reward_judge.py",
    "tests/unit/learner/test_checkpoint_files.py",
    "tests/e2e/test_two_writers.py",
    "tests/e2e/test_corrupt_files.py",
    "tests/deploy/test_prometheus.py",
    "tests/integration/test_codejudge_hostile.py",
    "tests/integration/test_reward_service.py",
)
"""Modules that take longest, started first: `make test` runs the suite on two workers, a module
to a worker (`pytest -n 2 --dist loadscope`), and a long module started last would run alone at
the end. Order within a module is kept."""


def pytest_collection_modifyitems(items: list) -> None:
    rank = {path: k for k, path in enumerate(LONGEST_FIRST)}

    def key(item) -> int:
        path = Path(str(item.fspath)).resolve().relative_to(Path(__file__).resolve().parents[1]).as_posix()
        return rank.get(path, len(rank))

    items.sort(key=key)  # stable: the rest keep their order


@pytest.fixture(scope="session")
def redis_server():
    from magic.local.redis_server import RedisServer

    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def r(redis_server):
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """An untrained Qwen2-architecture model (~27k parameters) with the demo tokenizer."""
    import torch
    from transformers.utils import logging as hf_logging

    from magic.demo.prepare import build_model

    hf_logging.disable_progress_bar()
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny-model")
    build_model(out, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    return out
