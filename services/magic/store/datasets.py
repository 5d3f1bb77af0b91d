"""The index of registered datasets (hash `magic:datasets`: name -> DatasetInfo as JSON).

What a record means — validation, summaries, loading the file — is the controller's
(`magic.controller.datasets.DatasetRegistry`); this module only stores the records.
"""

from __future__ import annotations

import redis

from magic.protocol import keys


class DatasetIndex:
    def __init__(self, r: redis.Redis):
        self.r = r

    def put(self, name: str, record: str) -> None:
        self.r.hset(keys.DATASETS, name, record)

    def get(self, name: str) -> bytes | None:
        return self.r.hget(keys.DATASETS, name)

    def values(self) -> list[bytes]:
        return self.r.hvals(keys.DATASETS)

    def delete(self, name: str) -> bool:
        return bool(self.r.hdel(keys.DATASETS, name))
