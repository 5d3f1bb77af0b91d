"""Sentinel URLs: every part parsed, every malformed one refused with what is wrong."""

from __future__ import annotations

import pytest

from magic.store.client import SentinelURL


def test_a_full_url():
    u = SentinelURL.parse("redis+sentinel://app:p%40ss@s1:26380,s2,10.0.0.3:5000/my-master/2?sentinel_password=spw&sentinel_username=su")
    assert u.sentinels == (("s1", 26380), ("s2", 26379), ("10.0.0.3", 5000))
    assert (u.master, u.db, u.username, u.password) == ("my-master", 2, "app", "p@ss")
    assert (u.sentinel_username, u.sentinel_password, u.tls) == ("su", "spw", False)


def test_ipv6_sentinels_in_brackets():
    assert SentinelURL.parse("redis+sentinel://[::1]:26380,[fd00::5]/m").sentinels == (("::1", 26380), ("fd00::5", 26379))


def test_defaults_and_tls():
    u = SentinelURL.parse("rediss+sentinel://:pw@sentinel/mymaster")
    assert u.sentinels == (("sentinel", 26379),) and (u.master, u.db, u.username, u.password, u.tls) == ("mymaster", 0, None, "pw", True)
    assert SentinelURL.parse("redis+sentinel://h/m").password is None


@pytest.mark.parametrize("url, why", [
    ("redis://h:6379/0", "not a Sentinel URL"),
    ("redis+sentinel://h:26379", "the path must be"),
    ("redis+sentinel://h/m/x", "the path must be"),
    ("redis+sentinel://h/m/0/1", "the path must be"),
    ("redis+sentinel://h:port/m", "bad sentinel address"),
    ("redis+sentinel://h1,,h2/m", "bad sentinel address"),
    ("redis+sentinel://[::1]x/m", "bad sentinel address"),
    ("redis+sentinel://[::1]:p/m", "bad sentinel address"),
    ("redis+sentinel://h/m?password=x", "unknown options"),
])
def test_malformed_urls_say_what_is_wrong(url, why):
    with pytest.raises(ValueError, match=why):
        SentinelURL.parse(url)
