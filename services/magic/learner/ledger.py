"""The learner's per-step accounting: each step's groups, each counted once.

Redelivery (a worker that died before acknowledging) and straggler regeneration can put two
copies of a group on `scored`; the ledger keeps the first copy of each group id and remembers
every entry id, so the step's commit acknowledges all of them (`magic.store.steps`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _StepItems(Generic[T]):
    items: dict[str, T] = field(default_factory=dict)  # group id -> item, first copy wins
    entry_ids: list[str] = field(default_factory=list)  # every entry seen, duplicates included


class StepLedger(Generic[T]):
    """Per-step accounting: each step's groups, each counted once, and whether the step is complete.

    `add` returns False for a group id the step already has (a redelivered or regenerated copy);
    the caller acknowledges such entries together with the step, so nothing is left pending.
    """

    def __init__(self) -> None:
        self._steps: dict[int, _StepItems[T]] = {}
        self.duplicates = 0

    def add(self, step: int, group_id: str, entry_id: str, item: T) -> bool:
        s = self._steps.setdefault(step, _StepItems())
        s.entry_ids.append(entry_id)
        if group_id in s.items:
            self.duplicates += 1
            return False
        s.items[group_id] = item
        return True

    def count(self, step: int) -> int:
        s = self._steps.get(step)
        return len(s.items) if s else 0

    def items(self, step: int) -> dict[str, T]:
        """The step's items so far, by group id (arrival order)."""
        s = self._steps.get(step)
        return dict(s.items) if s else {}

    def is_complete(self, step: int, expected: int) -> bool:
        return self.count(step) >= expected

    def steps(self) -> list[int]:
        return sorted(self._steps)

    def pop(self, step: int) -> tuple[list[T], list[str]]:
        """Remove the step: its items in group-id order and every entry id to acknowledge."""
        s = self._steps.pop(step, None)
        if s is None:
            return [], []
        return [s.items[k] for k in sorted(s.items)], s.entry_ids
