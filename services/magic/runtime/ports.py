"""Free TCP ports for the processes a local run (or a test) starts on one machine.

A port the kernel hands out for `bind(0)` comes from its ephemeral range, the same range every
outgoing connection and every listener torch.distributed/gloo opens without a port draws from:
between our picking it and the server's binding it, one of those may take it ("Address already
in use"). So ports are picked at random *below* the ephemeral range, checked free on every
address, and never handed out twice by one process.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

LOW = 20000
"""The lowest port handed out (below it: well-known and registered services, e.g. 6379, 8000-9999)."""
AVOID = frozenset({29400, 29500})
"""torchrun's default rendezvous and master ports."""

_given: set[int] = set()
_lock = threading.Lock()
_random = random.SystemRandom()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports picked automatically (Linux's default when it cannot be read)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def is_free(port: int) -> bool:
    """Whether a server could listen on `port` on every address now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port nothing listens on, outside the ephemeral range, not handed out before by this process."""
    eph_low, eph_high = ephemeral_range()
    low, high = (LOW, eph_low - 1) if eph_low - LOW > 1000 else (max(LOW, eph_high + 1), 65535)
    with _lock:
        for _ in range(1000 if high - low > 1000 else 0):
            port = _random.randint(low, high)
            if port not in _given and port not in AVOID and is_free(port):
                _given.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no room outside the ephemeral range: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
