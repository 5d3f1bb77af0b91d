"""Functions registered by name: advantage estimators, math verifiers, reward penalties.

    ESTIMATORS = Registry("advantage estimator")

    @ESTIMATORS.register("grpo")
    def grpo(...): ...

    ESTIMATORS.lookup("grpo")     # the function; an unknown name is a ValueError listing the known ones

Registering a name twice is an error (a silent overwrite would change the algorithm behind a
config value). A registry is a read-only mapping: `name in R`, `R[name]`, `sorted(R)`, `R.items()`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Name -> function, filled by the `register` decorator; `kind` names the entries in errors."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register the function under `name`; a name registered twice is a ValueError."""

        def wrap(fn: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = fn
            return fn

        return wrap

    def lookup(self, name: str) -> T:
        """The entry under `name`; an unknown name is a ValueError that lists the known ones."""
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {sorted(self._entries)}") from None

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
