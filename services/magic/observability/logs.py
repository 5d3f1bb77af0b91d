"""Logging setup shared by every service: one line per record, service and worker in each line."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

_URL_PASSWORD = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:@/\s]*):(?P<password>[^@/\s]+)@")
_QUERY_PASSWORD = re.compile(r"(?P<key>[?&][a-z_]*password=)[^&#\s]+")


def redact_url(text: str) -> str:
    """`text` with the password of every `scheme://user:password@host` URL, and every `…password=`
    query parameter (a Sentinel URL's `sentinel_password`), replaced by `***` (a Redis URL carries
    its password: MAGIC_REDIS_URL).

    >>> redact_url("redis://:s3cret@redis:6379/0 and rediss://app:pw@h:1")
    'redis://:***@redis:6379/0 and rediss://app:***@h:1'
    >>> redact_url("redis+sentinel://:pw@s1,s2/m?sentinel_password=spw&sentinel_username=u")
    'redis+sentinel://:***@s1,s2/m?sentinel_password=***&sentinel_username=u'
    """
    text = _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    return _QUERY_PASSWORD.sub(lambda m: f"{m['key']}***", text)


class RedactingFormatter(logging.Formatter):
    """A Formatter whose every line — message, arguments and traceback — has URL passwords redacted."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_url(super().format(record))


def setup_logging(service: str, worker: str, level: str = "INFO") -> None:
    """Configure the root logger to write `time level service[worker] logger: message` to stderr,
    with the password of any URL in it redacted."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        RedactingFormatter(f"%(asctime)s %(levelname)s {service}[{worker}] %(name)s: %(message)s", datefmt="%H:%M:%S")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def tail(path: Path, lines: int) -> str:
    """The last `lines` lines of the log file at `path` ("" if it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
