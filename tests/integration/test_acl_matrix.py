"""Least privilege on the bus, probed: each role's credentials against every key kind and command
class of docs/security.md's matrix, on a real Redis. The table is the intended matrix; the ACL rules
(`magic.store.acl`) are what Redis enforces; the two must agree cell by cell."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from magic.store import acl

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"

CLASSES = {
    "string": {"r": ("GET", "{k}"), "w": ("SET", "{k}", "x"), "i": ("INCR", "{k}"), "d": ("DEL", "{k}")},
    "hash": {"r": ("HGETALL", "{k}"), "w": ("HSET", "{k}", "f", "x"), "d": ("DEL", "{k}")},
    "set": {"r": ("SMEMBERS", "{k}"), "w": ("SADD", "{k}", "x"), "d": ("DEL", "{k}")},
    "list": {"r": ("LRANGE", "{k}", "0", "-1"), "w": ("RPUSH", "{k}", "x"), "d": ("DEL", "{k}")},
    "zset": {"r": ("ZRANGE", "{k}", "0", "-1"), "w": ("ZADD", "{k}", "1", "x"), "d": ("DEL", "{k}")},
    "stream": {
        "r": ("XRANGE", "{k}", "-", "+"),
        "w": ("XADD", "{k}", "*", "f", "x"),
        "c": ("XREADGROUP", "GROUP", "g", "probe", "COUNT", "1", "STREAMS", "{k}", ">"),
        "a": ("XACK", "{k}", "g", "{id}"),
        "k": ("XCLAIM", "{k}", "g", "thief", "0", "{id}"),
        "t": ("XTRIM", "{k}", "MAXLEN", "0"),
        "g": ("XGROUP", "SETID", "{k}", "g", "0"),
        "d": ("DEL", "{k}"),
    },
}
"""One command per class and key type: what the probe runs as each role."""


def intended() -> list[tuple[str, str, dict[str, set[str]]]]:
    """docs/security.md's matrix: (key, type, role -> allowed classes)."""
    text = DOC.read_text()
    table = text[text.index("<!-- acl-matrix -->"):text.index("<!-- /acl-matrix -->")]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.splitlines() if line.startswith("| `")]
    header = ["controller", "learner", "rollout", "reward"]
    out = []
    for key, kind, *cells in rows:
        allowed = {role: set(CLASSES[kind]) if cell == "all" else set() if cell == "-" else set(cell.split()) for role, cell in zip(header, cells)}
        out.append((key.strip("`"), kind, allowed))
    return out


def concrete(key: str) -> str:
    return key.replace("<run>", "{probe}").replace("<k>", "3").replace("<s>", "1").replace("<worker>", "w1")


def prepare(admin: redis.Redis, key: str, kind: str) -> str:
    """`key` anew with one value of `kind` (a stream: one entry pending in group `g`); returns an entry id."""
    admin.delete(key)
    if kind == "string":
        admin.set(key, 5)
    elif kind == "hash":
        admin.hset(key, "f", "v")
    elif kind == "set":
        admin.sadd(key, "v")
    elif kind == "list":
        admin.rpush(key, "v")
    elif kind == "zset":
        admin.zadd(key, {"v": 1})
    else:
        entry = admin.xadd(key, {"f": "v"}).decode()
        admin.xgroup_create(key, "g", id="0")
        admin.xreadgroup("g", "owner", {key: ">"})
        return entry
    return "0-1"


@pytest.fixture
def users(r, redis_server):
    passwords = {role: f"{role}-pw" for role in acl.ROLES}
    urls = acl.create_users_at(redis_server.url, passwords)
    clients = {role: redis.Redis.from_url(url) for role, url in urls.items()}
    yield clients
    for c in clients.values():
        c.close()


def allowed(client: redis.Redis, command: tuple[str, ...]) -> bool:
    try:
        client.execute_command(*command)
    except redis.exceptions.NoPermissionError:
        return False
    except redis.ResponseError:  # any other refusal (no such group, wrong type) comes after the permission check
        pass
    return True


def test_the_matrix_lists_every_key_the_platform_writes():
    """Every kind of key in `magic.protocol.keys` has a row (a new key cannot land unprobed)."""
    listed = {key for key, _, _ in intended()}
    from magic.protocol import keys

    run = keys.RunKeys("<run>")
    names = {name for name in dir(keys.RunKeys) if isinstance(getattr(keys.RunKeys, name), property) and name not in ("_p",)}
    for name in names:
        key = getattr(run, name).replace("{<run>}", "<run>")
        assert key in listed or name in ("estimation", "eval_seq", "pass_rates", "validations"), f"{key} has no row in the matrix"
    for role in keys.SENDERS:
        assert run.events_of(role).replace("{<run>}", "<run>") in listed
    for role in keys.ROLES:
        assert run.dead_of(role).replace("{<run>}", "<run>") in listed
        if role != "controller":
            assert keys.heartbeat(role, "<worker>") in listed


def test_each_role_may_do_exactly_what_the_matrix_says(r, users):
    """Every cell: the command class runs as the role iff the table allows it."""
    mismatches = []
    for key, kind, expected in intended():
        k = concrete(key)
        for role, client in users.items():
            for cls, template in CLASSES[kind].items():
                entry = prepare(r, k, kind)
                command = tuple(part.replace("{k}", k).replace("{id}", entry) for part in template)
                if allowed(client, command) != (cls in expected[role]):
                    mismatches.append(f"{role} {cls} {key}: {'allowed' if cls not in expected[role] else 'refused'}")
    assert not mismatches, "\n".join(mismatches)


@pytest.mark.parametrize("role", ["learner", "rollout", "reward"])
def test_no_worker_role_gets_around_its_grants(r, users, role):
    """Scripts re-check every call; multi-key commands need one grant holding all their keys; no
    worker may run administrative or dangerous commands."""
    client = users[role]
    r.hset("magic:{probe}:state", "status", "running")
    r.set("magic:{probe}:seq", 7)
    attempts = [
        ("EVAL", "return redis.call('hset', 'magic:{probe}:state', 'status', 'finished')", "0"),
        ("EVAL", "return redis.call('del', KEYS[1])", "1", "magic:{probe}:seq"),
        ("EVAL", f"return redis.call('set', 'magic:{{probe}}:seq:learner', 0)", "0"),
        ("FLUSHALL",), ("CONFIG", "SET", "appendonly", "no"), ("KEYS", "*"), ("ACL", "LIST"),
        ("RENAME", "magic:{probe}:seq", f"magic:hb:{role}:x"), ("COPY", "magic:{probe}:seq", f"magic:hb:{role}:y"),
        ("MIGRATE", "127.0.0.1", "1", "magic:{probe}:seq", "0", "1"), ("SHUTDOWN",), ("SCRIPT", "FLUSH"), ("FUNCTION", "FLUSH"),
        ("PUBLISH", "c", "x"), ("SUBSCRIBE", "c"),
    ]
    for command in attempts:
        with pytest.raises(redis.ResponseError) as refused:
            client.execute_command(*command)
        assert isinstance(refused.value, redis.exceptions.NoPermissionError) or "The user executing the script can't" in str(refused.value), (command, refused.value)
    assert r.hget("magic:{probe}:state", "status") == b"running" and r.get("magic:{probe}:seq") == b"7"


def test_the_controllers_user_may_not_administer_redis(users):
    for command in [("FLUSHALL",), ("CONFIG", "SET", "appendonly", "no"), ("ACL", "SETUSER", "x"), ("KEYS", "*")]:
        with pytest.raises(redis.exceptions.NoPermissionError):
            users["controller"].execute_command(*command)


def test_a_refused_command_names_the_user_key_and_command_in_the_acl_log(r, users):
    """Redis itself records each refusal (ACL LOG: user, key or command, reason): an operator sees
    who tried what, beside the service's own log line."""
    r.execute_command("ACL", "LOG", "RESET")
    with pytest.raises(redis.exceptions.NoPermissionError):
        users["reward"].xadd("magic:{probe}:events:learner", {"type": "Event", "pb": b""})  # XADD it may run, on another role's key
    (log,) = r.acl_log()
    assert log["username"] == "magic-reward" and log["object"] == "magic:{probe}:events:learner" and log["reason"] == "key"
    assert log["client-info"]["cmd"] == "xadd"
