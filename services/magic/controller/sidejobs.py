"""Side jobs: the controller's work beside the step loop, one interface for all of them.

Offline difficulty estimation (`estimation.DifficultyEstimation`), held-out validation and
requested evaluations (`validation.Evaluation`) each publish prompt groups of a kind of their own
that go through the rollout and reward services like training groups and come back, scored, on
the controller's `estimates` stream — never to the learner. A side job

    advance()   publishes what it can and says whether it is done (raising, with the reason,
                when it cannot be: a timeout, a dataset gone)
    result()    its outcome once done (figures, a record)
    version     the policy version every rollout worker must serve while it runs (None: it
                needs no worker: done already)

and the scored groups of its kind reach it through `SideJobs.route` (`receive(batch)` of the
receiver registered for the kind). A job never calls into the driver: the driver runs it
(`StepDriver._run_side_job`) —

    while not job.advance():
        check control requests, read events and route the `estimates` stream, renew the lease

once every live rollout worker serves the job's version, so the step loop stays the paper's
outer loop with side jobs at its step boundaries.
"""

from __future__ import annotations

from typing import Any, Protocol

from magic.protocol.pb import messages_pb2 as pb
from magic.store.streams import ConsumerGroup, Entry

Batch = list[tuple[Entry, pb.ScoredGroup]]


class SideJob(Protocol):
    version: int | None

    def advance(self) -> bool: ...

    def result(self) -> Any: ...


class Receiver(Protocol):
    def receive(self, batch: Batch) -> None:
        """Take scored groups of the receiver's kind (and acknowledge them)."""


class Done:
    """A side job found done before it started (a validation stored before a restart)."""

    version = None

    def __init__(self, result: Any):
        self._result = result

    def advance(self) -> bool:
        return True

    def result(self) -> Any:
        return self._result


class SideJobs:
    """The receivers of the `estimates` stream by group kind; a scored group of a kind nobody
    takes now is dead-lettered with the reason (an estimation result while the run estimates
    nothing, a training group sent there)."""

    def __init__(self, estimates: ConsumerGroup):
        self.estimates = estimates
        self._by_kind: dict[int, Receiver] = {}

    def register(self, kind: int, receiver: Receiver) -> None:
        self._by_kind[kind] = receiver

    def unregister(self, kind: int) -> None:
        self._by_kind.pop(kind, None)

    def route(self, block_ms: int | None = None) -> int:
        """Read the `estimates` stream (this controller's pending entries first, then others' dead
        ones) and hand each scored group to the receiver of its kind; returns how many were read."""
        entries = self.estimates.reclaim_from_others_if_due(1.0) + self.estimates.read(count=200, block_ms=block_ms)
        batches: dict[int, Batch] = {}
        for entry in entries:
            if (group := self.estimates.decode(entry, pb.ScoredGroup)) is None:
                continue  # poison: dead-lettered by decode
            kind = group.rollout.prompt.kind
            if kind not in self._by_kind:
                self.estimates.dead_letter(entry, f"a scored {pb.GroupKind.Name(kind) if kind in pb.GroupKind.values() else kind} group nobody takes now "
                                                  f"(this run's side jobs: {', '.join(pb.GroupKind.Name(k) for k in sorted(self._by_kind)) or 'none'})")
                continue
            batches.setdefault(kind, []).append((entry, group))
        for kind, batch in batches.items():
            self._by_kind[kind].receive(batch)
        return len(entries)
