"""Exit statuses of the `magic` command and of `magic local`, each with its meaning (shown by `magic --help`)."""

from __future__ import annotations

import enum


class Exit(enum.IntEnum):
    """Exit statuses of `magic`; each member's meaning is `EXIT_MEANING[member]` (shown by `magic --help`)."""

    ok = 0
    failed = 1
    usage = 2
    auth = 3
    not_found = 4
    conflict = 5
    unreachable = 6
    interrupted = 130


EXIT_MEANING = {
    Exit.ok: "success",
    Exit.failed: "the run failed (magic status), a service died (magic local), the controller had a server error, or the learner's shape does not fit (magic memory)",
    Exit.usage: "bad flags or file, or a request the controller rejected as invalid (HTTP 400, 422)",
    Exit.auth: "the controller refused the token, or none was sent (HTTP 401, 403)",
    Exit.not_found: "no such run or dataset (HTTP 404)",
    Exit.conflict: "the request conflicts with the run's state: ended run, existing name, busy (HTTP 409)",
    Exit.unreachable: "no answer from the controller: connection refused, unknown host, timeout",
    Exit.interrupted: "interrupted (Ctrl-C)",
}


def exit_for_status(status: int | None) -> Exit:
    """The exit status of a failed request: from its HTTP status, or None when nothing answered."""
    if status is None:
        return Exit.unreachable
    return {400: Exit.usage, 422: Exit.usage, 401: Exit.auth, 403: Exit.auth, 404: Exit.not_found, 409: Exit.conflict}.get(status, Exit.failed)


def exit_codes_help() -> str:
    return "exit status:\n" + "\n".join(f"  {e.value:<4d}{EXIT_MEANING[e]}" for e in Exit)
