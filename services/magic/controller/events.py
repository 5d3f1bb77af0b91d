"""The controller's inbox: the events the other roles send a run, screened by who sent them.

Each sending role appends to a stream of its own (`magic:{<run>}:events:<role>`), which only that
role's Redis user may append to (`magic.store.acl`), so the stream an event arrives on says who
sent it. The inbox reads the three streams in the controller's consumer group and applies:

    StepCompleted(k)   only from the learner, and only once the learner has committed step k
                       (`learner.last_step >= k`: the same MULTI sends it); written once — a
                       second StepCompleted(k) (received or recorded already) is acknowledged and
                       logged, never applied
    WorkerError        from the learner: the run fails with its reason; from a rollout or reward
                       worker: the run fails only once no worker of that service is live (one
                       pod's failure is not the run's: Kubernetes restarts it, its siblings go on)
    anything else      an entry over `EVENT_MAX_BYTES`, of another run, of no known kind, or of a
                       kind its sender may not send: a one-line dead letter with the reason

Refused entries are logged once each (the dead letter names the stream, so the role, and why).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from magic.controller.errors import RunFailed
from magic.protocol import codec, keys
from magic.protocol.pb import messages_pb2 as pb
from magic.store.channels import RunChannels
from magic.store.runs import RunStore
from magic.store.steps import StepStore, event_problem
from magic.store.streams import ConsumerGroup, Entry

log = logging.getLogger(__name__)

EVENT_MAX_BYTES = 64 << 10
"""The largest event the controller reads (a StepCompleted with every step metric is ~2 KB, a
WorkerError's message is cut at 4000 characters): a larger entry is dead-lettered without its bytes."""


@dataclass
class _PendingError:
    event: pb.Event  # the newest error of the role
    entry_id: str  # its entry, acknowledged once the error is dropped (pending meanwhile: a restarted controller reads it again)
    since: float  # when the role's first pending error arrived


class EventInbox:
    """The events of one run, read by its driver (the holder of the controller lease)."""

    def __init__(self, channels: RunChannels, steps: StepStore, store: RunStore, group: str, error_grace_seconds: float):
        self.channels = channels
        self.steps = steps
        self.store = store
        self.groups: dict[str, ConsumerGroup] = {role: channels.group(channels.keys.events_of(role), group) for role in keys.SENDERS}
        self.completed: dict[int, tuple[str, pb.StepCompleted]] = {}
        """StepCompleted(k) received and not yet recorded: k -> (entry id, event)."""
        self.error_grace_seconds = error_grace_seconds
        """How long a worker's error waits for its service to have no live worker before it is dropped."""
        self._errors: dict[str, _PendingError] = {}

    def poll(self, block_ms: int = 0) -> None:
        """Read what arrived (waiting up to `block_ms` on the learner's stream); RunFailed for a
        learner's error, or a worker's error once its service has no live worker."""
        for role, group in self.groups.items():
            # only the lease holder reads the controller's groups: what another (a predecessor, or a
            # stale driver that read before it noticed its lost lease) left pending is this driver's
            entries = group.reclaim_from_others_if_due(1.0) + group.read(count=100, block_ms=(block_ms if role == "learner" else 0) or 1)
            for entry in entries:
                self._receive(role, group, entry)
        self._check_errors()

    def take(self, k: int) -> tuple[str, pb.StepCompleted]:
        """StepCompleted(k) and its entry id, to record (the entry is acknowledged with the record)."""
        return self.completed.pop(k)

    def queue_ack_step(self, pipe, entry_id: str) -> None:
        """Queue the acknowledgement of a recorded StepCompleted on `pipe` (the record's MULTI)."""
        self.groups["learner"].queue_ack(pipe, entry_id)

    # -- screening ---------------------------------------------------------------------------

    def _receive(self, role: str, group: ConsumerGroup, entry: Entry) -> None:
        size = len(entry.fields.get(codec.PAYLOAD_FIELD, b""))
        if size > EVENT_MAX_BYTES:
            group.dead_letter(entry, f"refused Event: {size} bytes from role {role}, over {EVENT_MAX_BYTES}", keep_payload=False)
            return
        event = group.decode(entry, pb.Event, check=lambda e: self._problem(role, e))
        if event is None:
            return
        kind = event.WhichOneof("kind")
        if kind == "step_completed":
            k = event.step_completed.step
            if k in self.completed and self.completed[k][0] == entry.id:
                return  # the same entry again (this consumer's pending entries are re-read after a reclaim)
            if k < self.store.metrics_count() or k in self.completed:
                group.ack(entry.id)  # write-once: a replay of a step received or recorded already
                log.warning("run %s: StepCompleted(%d) again (entry %s of %s): acknowledged, not applied", self.channels.run_id, k, entry.id, group.stream)
                return
            self.completed[k] = (entry.id, event.step_completed)
            return  # acknowledged once the step is recorded
        if kind == "worker_error" and role != "learner":
            pending = self._errors.get(role)
            if pending is not None and pending.entry_id == entry.id:
                return  # the same entry again
            log.error("run %s: %s %s reports: %s", self.channels.run_id, role, event.source, event.worker_error.message)
            if pending is not None:
                group.ack(pending.entry_id)  # the newest error of the role stands for it
            self._errors[role] = _PendingError(event, entry.id, pending.since if pending else time.monotonic())
            return
        group.ack(entry.id)
        if kind == "worker_error":
            raise RunFailed(f"{event.worker_error.service} {event.source}: {event.worker_error.message}")

    def _problem(self, role: str, event: pb.Event) -> str | None:
        """Why `event`, read on `role`'s stream, is refused, or None."""
        if (problem := event_problem(event, self.channels.run_id)) is not None:
            return problem
        kind = event.WhichOneof("kind")
        if kind == "step_completed":
            if role != "learner":
                return f"a StepCompleted on the {role} role's stream (only the learner completes steps)"
            if event.step_completed.step > (last := self.steps.last_trained()):
                return f"StepCompleted({event.step_completed.step}) but the learner has committed step {last} only"
        if kind == "worker_error" and event.worker_error.service != role:
            return f"a WorkerError naming service {event.worker_error.service!r} on the {role} role's stream"
        return None

    def _check_errors(self) -> None:
        """A worker's error fails the run once its service has no live worker; it is dropped once
        the service has had live workers for `error_grace_seconds` since."""
        for role, pending in list(self._errors.items()):
            live = self.channels.alive(role)
            error = pending.event.worker_error
            if not live:
                raise RunFailed(f"{error.service} {pending.event.source}: {error.message} (no {role} worker is live)")
            if time.monotonic() - pending.since > self.error_grace_seconds:
                log.warning("run %s: %s's error is not the run's: %d %s workers are live (%s)", self.channels.run_id, pending.event.source, len(live), role, ", ".join(sorted(live)))
                self.groups[role].ack(pending.entry_id)
                del self._errors[role]
