"""Shared fixtures: a private redis-server, a Redis client wiped per test, a tiny random model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
