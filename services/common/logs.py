"""Logging setup shared by every service: one line per record, service and worker in each line."""

from __future__ import annotations

import logging
import sys


def setup_logging(service: str, worker: str, level: str = "INFO") -> None:
    """Configure the root logger to write `time level service[worker] logger: message` to stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s %(levelname)s {service}[{worker}] %(name)s: %(message)s", datefmt="%H:%M:%S")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
