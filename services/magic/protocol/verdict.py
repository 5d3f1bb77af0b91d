"""The verdict on one response, shared by every verifier (math and code)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Status(str, Enum):
    """What a verifier concluded about one response."""

    correct = "correct"
    wrong = "wrong"
    no_answer = "no_answer"  # no final answer / no program found (truncated responses usually land here)
    timeout = "timeout"  # the verifier's own hard wall-clock bound was reached
    error = "error"  # the verifier (or the ground truth) failed, not the response; details say why


@dataclass(frozen=True)
class Verdict:
    """The verdict on one response: a status, the answer judged, why, and how long it took."""

    status: Status
    answer: str = ""  # the extracted final answer or program (truncated for display)
    details: str = ""  # why, in a few words
    seconds: float = 0.0

    @property
    def correct(self) -> bool:
        return self.status is Status.correct
