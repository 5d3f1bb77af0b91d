"""Polling for the tests that drive services as processes."""

from __future__ import annotations

import time
from pathlib import Path


def wait_for(predicate, timeout: float, what: str, sup=None, interval: float = 0.05):
    """Poll `predicate` until it returns something truthy (returned), failing after `timeout`
    seconds with `what`, or at once with its log tail if a process of `sup` (a Supervisor) died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sup is not None and (dead := sup.first_exit()) is not None:
            raise AssertionError(f"{dead.name} died:\n{dead.log_tail()}")
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def answers(url: str) -> bool:
    """Whether GET `url` answers 200 now (a service's /readyz); False while it cannot be reached."""
    import httpx

    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def alive(pid: int) -> bool:
    """Is process `pid` running (not gone, not a zombie)? Reads /proc/PID/stat after the command
    name, which may hold spaces and parentheses."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
