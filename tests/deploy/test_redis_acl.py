"""Least privilege on the bus, as the chart deploys it: the bundled Redis's container command is run
here as a process (a real redis-server), and each component connects with the MAGIC_REDIS_URL the
chart gives it: a write outside its role is refused (NOPERM), its own writes go through."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest
import redis

from magic.local.redis_server import free_port
from magic.store import acl

from .conftest import CHART, RELEASE
from .test_chart import container, env, one, pod_spec, render

pytestmark = pytest.mark.deploy

PASSWORDS = {"REDIS_PASSWORD": "admin-pw", **{f"PASSWORD_{r.upper()}": f"{r}-pw-0123" for r in acl.ROLES}}
"""What the hook Job would have generated into the Secrets."""


def test_the_charts_acl_file_is_the_storage_layers():
    """One declaration of the roles' rights: the chart's copy is generated from `magic.store.acl`."""
    assert (CHART / "files" / "redis-users.acl").read_text() == acl.acl_file_template()


@pytest.fixture(scope="module")
def deployed(chart, tmp_path_factory):
    docs = render(chart, None)
    conf_map = one(docs, "ConfigMap", f"{RELEASE}-magic-redis")["data"]
    redis_container = container(pod_spec(docs, "StatefulSet", "redis"), "redis")
    assert redis_container["command"] == ["sh", "-c"]
    work = tmp_path_factory.mktemp("redis")
    (work / "etc").mkdir()
    port = free_port()
    conf = conf_map["redis.conf"].replace("port 6379", f"port {port}\nbind 127.0.0.1").replace("dir /data", f"dir {work}")
    (work / "etc" / "redis.conf").write_text(conf)
    (work / "etc" / "users.acl").write_text(conf_map["users.acl"])
    script = redis_container["args"][0].replace("/etc/redis/", f"{work}/etc/").replace("/tmp/users.acl", f"{work}/users.acl")
    names = {e["name"] for e in redis_container["env"]}
    assert set(PASSWORDS) <= names, names
    proc = subprocess.Popen(["sh", "-c", script], env={"PATH": os.environ["PATH"], **PASSWORDS}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=port, password=PASSWORDS["REDIS_PASSWORD"]).ping()
                break
            except redis.RedisError:
                assert proc.poll() is None and time.monotonic() < deadline, "the chart's redis command did not start"
                time.sleep(0.1)
        yield docs, port, work
    finally:
        proc.terminate()
        proc.wait(10)


def client_of(docs, port: int, component: str) -> redis.Redis:
    """A client as `component`'s pod would connect: the URL the chart gives it, its password the Secret's."""
    kind = "StatefulSet" if component == "learner" else "Deployment"
    e = env(container(pod_spec(docs, kind, component), component))
    assert e["MAGIC_REDIS_PASSWORD"]["secretKeyRef"]["name"] == f"{RELEASE}-magic-redis-{component}"
    url = e["MAGIC_REDIS_URL"].replace("$(MAGIC_REDIS_PASSWORD)", PASSWORDS[f"PASSWORD_{component.upper()}"])
    return redis.Redis.from_url(re.sub(r"@[^/]+/", f"@127.0.0.1:{port}/", url))


def test_the_file_on_disk_holds_no_password(deployed):
    _, _, work = deployed
    text = (work / "users.acl").read_text()
    assert all(pw not in text for pw in PASSWORDS.values())


@pytest.mark.parametrize(
    "component, key, write, allowed",
    [
        ("reward", "weights", lambda c, k: c.xadd(k, {"type": "WeightUpdate", "pb": b""}), False),  # cannot announce weights
        ("reward", "scored", lambda c, k: c.xadd(k, {"type": "ScoredGroup", "pb": b""}), True),
        ("rollout", "learner", lambda c, k: c.hset(k, "last_step", 7), False),  # cannot complete a step
        ("rollout", "events", lambda c, k: c.xadd(k, {"type": "Event", "pb": b""}), True),  # reports its own errors
        ("rollout", "state", lambda c, k: c.hset(k, "status", "finished"), False),
        ("rollout", "rollouts", lambda c, k: c.delete(k), False),
        ("learner", "weights", lambda c, k: c.xadd(k, {"type": "WeightUpdate", "pb": b""}), True),
        ("learner", "spec", lambda c, k: c.set(k, "{}"), False),
        ("controller", "spec", lambda c, k: c.set(k, "{}"), True),
        ("controller", "spec", lambda c, k: c.flushall(), False),
    ],
)
def test_each_component_writes_only_what_its_role_writes(deployed, component, key, write, allowed):
    docs, port, _ = deployed
    client = client_of(docs, port, component)
    k = f"magic:{{run}}:{key}"
    if allowed:
        write(client, k)
    else:
        with pytest.raises(redis.exceptions.NoPermissionError):
            write(client, k)

