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

from magic.config.settings import ServiceSettings
from magic.runtime.ports import free_port
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
    # the Secrets as the pod's `secrets` volume lays them out (no password in the environment)
    assert "env" not in redis_container and not any(pw in str(redis_container) for pw in PASSWORDS.values())
    sources = one_volume(pod_spec(docs, "StatefulSet", "redis"), "secrets")["projected"]["sources"]
    files = {item["path"] for src in sources for item in src["secret"]["items"]}
    assert files == {"redis-password", *acl.ROLES}, files
    (work / "secrets").mkdir()
    for name in files:
        (work / "secrets" / name).write_text(PASSWORDS["REDIS_PASSWORD" if name == "redis-password" else f"PASSWORD_{name.upper()}"])
    script = redis_container["args"][0].replace("/etc/redis/", f"{work}/etc/").replace("/tmp/users.acl", f"{work}/users.acl")
    script = script.replace("/var/run/secrets/redis/", f"{work}/secrets/")
    proc = subprocess.Popen(["sh", "-c", script], env={"PATH": os.environ["PATH"]}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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


def one_volume(spec, name):
    (volume,) = [v for v in spec["volumes"] if v["name"] == name]
    return volume


def client_of(docs, port: int, component: str, tmp_path) -> redis.Redis:
    """A client as `component`'s pod would connect: its settings from the chart's variables, the
    password from the file its `secrets` volume holds (the role's Secret)."""
    kind = "StatefulSet" if component == "learner" else "Deployment"
    spec = pod_spec(docs, kind, component)
    e = env(container(spec, component))
    password = PASSWORDS[f"PASSWORD_{component.upper()}"]
    if "MAGIC_REDIS_PASSWORD_FILE" in e:
        (source,) = [s for s in one_volume(spec, "secrets")["projected"]["sources"] if s["secret"]["items"][0]["path"] == "redis-password"]
        assert source["secret"]["name"] == f"{RELEASE}-magic-redis-{component}"
        assert e["MAGIC_REDIS_PASSWORD_FILE"] == "/var/run/secrets/magic/redis-password" and "MAGIC_REDIS_PASSWORD" not in e
        (tmp_path / "redis-password").write_text(password)
        url = re.sub(r"@[^/]+/", f"@127.0.0.1:{port}/", e["MAGIC_REDIS_URL"])
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MAGIC_REDIS_URL", url)
            mp.setenv("MAGIC_REDIS_PASSWORD_FILE", str(tmp_path / "redis-password"))
            mp.delenv("MAGIC_REDIS_PASSWORD", raising=False)
            return redis.Redis.from_url(ServiceSettings().redis_url)
    # the learner's template does not mount its Secrets yet: the password as an EnvVar
    assert e["MAGIC_REDIS_PASSWORD"]["secretKeyRef"]["name"] == f"{RELEASE}-magic-redis-{component}"
    url = e["MAGIC_REDIS_URL"].replace("$(MAGIC_REDIS_PASSWORD)", password)
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
        ("rollout", "events:rollout", lambda c, k: c.xadd(k, {"type": "Event", "pb": b""}), True),  # reports its own errors
        ("rollout", "events:learner", lambda c, k: c.xadd(k, {"type": "Event", "pb": b""}), False),  # but not as the learner
        ("learner", "seq", lambda c, k: c.delete(k), False),  # the controller's write counter
        ("rollout", "state", lambda c, k: c.hset(k, "status", "finished"), False),
        ("rollout", "rollouts", lambda c, k: c.delete(k), False),
        ("learner", "weights", lambda c, k: c.xadd(k, {"type": "WeightUpdate", "pb": b""}), True),
        ("learner", "spec", lambda c, k: c.set(k, "{}"), False),
        ("controller", "spec", lambda c, k: c.set(k, "{}"), True),
        ("controller", "spec", lambda c, k: c.flushall(), False),
    ],
)
def test_each_component_writes_only_what_its_role_writes(deployed, component, key, write, allowed, tmp_path):
    docs, port, _ = deployed
    client = client_of(docs, port, component, tmp_path)
    k = f"magic:{{run}}:{key}"
    if allowed:
        write(client, k)
    else:
        with pytest.raises(redis.exceptions.NoPermissionError):
            write(client, k)

