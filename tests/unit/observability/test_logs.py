"""Log lines never carry a URL's password: the message, its arguments and tracebacks."""

from __future__ import annotations

import io
import logging

from magic.observability.logs import RedactingFormatter, redact_url


def test_redact_url_keeps_everything_but_the_password():
    assert redact_url("redis://:s3cr3t@redis:6379/0") == "redis://:***@redis:6379/0"
    assert redact_url("rediss://user:p%40ss@h.example:6380/1 ok") == "rediss://user:***@h.example:6380/1 ok"
    assert redact_url("redis://redis:6379/0 and http://h/x?a=b:c@d") == "redis://redis:6379/0 and http://h/x?a=b:c@d"
    assert redact_url("no url here: a:b@c") == "no url here: a:b@c"


def test_formatter_redacts_arguments_and_tracebacks():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(RedactingFormatter("%(message)s"))
    log = logging.getLogger("test-redaction")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("connecting to %s", "redis://:hunter2@redis:6379/0")
        try:
            raise ConnectionError("cannot reach redis://app:hunter2@10.0.0.5:6379/0")
        except ConnectionError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
    text = stream.getvalue()
    assert "hunter2" not in text
    assert "redis://:***@redis:6379/0" in text and "redis://app:***@10.0.0.5:6379/0" in text


def test_redact_url_hides_a_sentinel_password_in_the_query():
    url = "redis+sentinel://:pw@s1:26379,s2/magic/0?sentinel_password=s3nt&sentinel_username=mon"
    assert redact_url(f"up (redis {url})") == "up (redis redis+sentinel://:***@s1:26379,s2/magic/0?sentinel_password=***&sentinel_username=mon)"
