"""Process figures the benchmarks share (run them as `python benchmarks/<name>.py`)."""

from __future__ import annotations


def status_bytes(field: str) -> int:
    """A memory figure of this process from /proc/self/status (VmRSS: resident now, VmHWM: its
    high-water mark, RssAnon, ...), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def rss_bytes() -> int:
    """This process's resident memory now (VmRSS)."""
    return status_bytes("VmRSS")
