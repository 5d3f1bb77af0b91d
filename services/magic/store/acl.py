"""Least privilege on the bus: each service reaches Redis as its own ACL user, which may write only
the keys its role writes (Redis 7 ACLs: `%R~` read-only and `~` read-write key patterns, and an
allow-list of commands).

    rollout     reads the run's spec, step records, group digests and weight announcements;
                consumes `prompts`, appends `rollouts`, records the version it serves
    reward      consumes `rollouts`, appends `scored` and `estimates`
    learner     consumes `scored`; announces weights; commits steps (its state hash, `events`);
                holds the learner lease (its epoch counter) and bumps the write counter
    controller  owns the run: every key of every run, the run index and the active-run pointer

Every role reads and refreshes heartbeats, appends dead letters and worker errors (`dead`,
`events`), and reads the learner epoch and the write counter. So a reward worker cannot
announce weights, a rollout worker cannot complete a step, and no worker can change a run's
state or spec: Redis answers NOPERM and the service fails that one write.

`users(passwords)` gives the `ACL SETUSER` rules; `create_users(r, passwords)` applies them
(`magic local`, the tests); the Helm chart renders the same rules into Redis's ACL file
(`acl_file`). The default user keeps full access for the operator; give it a password.
"""

from __future__ import annotations

import redis

ROLES = ("controller", "rollout", "reward", "learner")

_RUN = "magic:{*}"

_CONNECTION = "+ping +hello +auth +select +client|setname +client|id +echo"
_TRANSACTIONS = "+multi +exec +discard +watch +unwatch"
_CONSUMER = "+xreadgroup +xack +xclaim +xautoclaim +xpending +xinfo|consumers +xinfo|groups +xinfo|stream +xgroup|create +xgroup|delconsumer +xrange +xrevrange +xlen"
_READ = "+get +mget +exists +hget +hmget +hgetall +hkeys +hvals +hlen +lrange +lindex +llen +zrange +scan +type +pttl +ttl"
_SCRIPTS = "+eval +evalsha +script|load"

_SHARED_KEYS = [
    "%R~magic:hb:*",  # heartbeats: the others' (SCAN, GET) to reclaim from the dead; its own: `_heartbeat`
    f"~{_RUN}:dead",  # dead letters (XADD)
    f"~{_RUN}:dead:seen",  # fan-out poison recorded once (SADD in a script)
    f"~{_RUN}:events",  # worker errors, step completions (XADD)
    f"%R~{_RUN}:spec",
    f"%R~{_RUN}:state",
    f"%R~{_RUN}:step:*",
    f"%R~{_RUN}:groups:*",
    f"%R~{_RUN}:weights",
    f"%R~{_RUN}:epoch:learner",
    f"%R~{_RUN}:seq",
    "%R~magic:active_run",
]
_SHARED_COMMANDS = f"{_CONNECTION} {_TRANSACTIONS} {_READ} {_CONSUMER} +xadd +xread +sadd {_SCRIPTS}"


def _heartbeat(role: str) -> str:
    """A selector: the role's own heartbeat keys, set and deleted (nothing else may be deleted)."""
    return f"(~magic:hb:{role}:* +set +del)"

RULES: dict[str, list[str]] = {
    "controller": ["~magic:*", "+@all", "-@dangerous", "-@admin", _CONNECTION],
    "rollout": [
        *_SHARED_KEYS,
        f"~{_RUN}:prompts",
        f"~{_RUN}:rollouts",
        f"~{_RUN}:weight_versions",
        _SHARED_COMMANDS,
        "+hset",
        _heartbeat("rollout"),
    ],
    "reward": [*_SHARED_KEYS, f"~{_RUN}:rollouts", f"~{_RUN}:scored", f"~{_RUN}:estimates", _SHARED_COMMANDS, _heartbeat("reward")],
    "learner": [
        *_SHARED_KEYS,
        f"~{_RUN}:scored",
        f"~{_RUN}:weights",
        f"~{_RUN}:learner",
        f"~{_RUN}:lease:learner",
        f"~{_RUN}:epoch:learner",
        f"~{_RUN}:seq",
        f"%R~{_RUN}:weight_versions",
        _SHARED_COMMANDS,
        "+hset +hdel +hsetnx +incr +incrby +set +pexpire +del",
        _heartbeat("learner"),
    ],
}
"""Key patterns and commands of each role (after `reset`: no keys, no commands)."""


def user_name(role: str) -> str:
    return f"magic-{role}"


def rules(role: str, password: str) -> list[str]:
    """The `ACL SETUSER magic-<role>` arguments: a fresh user with `password`, its keys and commands."""
    if role not in RULES:
        raise ValueError(f"unknown role {role!r}; known: {', '.join(ROLES)}")
    if not password or any(c.isspace() for c in password):
        raise ValueError(f"the password of {user_name(role)} must be non-empty, without spaces")
    out = ["reset", "on", f">{password}", "resetchannels"]
    for rule in RULES[role]:
        out += [rule] if rule.startswith("(") else rule.split()
    return out


def create_users(r: redis.Redis, passwords: dict[str, str]) -> None:
    """Create (or reset) the users of `passwords` (role -> password) on the Redis of `r`."""
    for role, password in passwords.items():
        r.execute_command("ACL", "SETUSER", user_name(role), *rules(role, password))


def create_users_at(url: str, passwords: dict[str, str]) -> dict[str, str]:
    """Create the users on the Redis at `url` (an administrator's URL); returns each role's URL."""
    with redis.Redis.from_url(url) as admin:
        create_users(admin, passwords)
    return {role: url_for(url, role, password) for role, password in passwords.items()}


def acl_file(passwords: dict[str, str]) -> str:
    """The same users as lines of a Redis ACL file (`aclfile`)."""
    return "".join(f"user {user_name(role)} {' '.join(rules(role, password))}\n" for role, password in passwords.items())


HASH_PLACEHOLDER = "#HASH_OF_{role}"


def acl_file_template() -> str:
    """The ACL file of every role with `#HASH_OF_<ROLE>` where the SHA-256 of its password goes
    (`#<hex>` in an ACL file: the file holds no password). The Helm chart ships it as
    `charts/magic/files/redis-users.acl`; its Redis fills the hashes in from the Secrets at start."""
    out = []
    for role in ROLES:
        words = rules(role, "x")
        words[words.index(">x")] = HASH_PLACEHOLDER.format(role=role.upper())
        out.append(f"user {user_name(role)} {' '.join(words)}\n")
    return "".join(out)


if __name__ == "__main__":  # regenerate the chart's copy: python -m magic.store.acl > charts/magic/files/redis-users.acl
    print(acl_file_template(), end="")


def url_for(url: str, role: str, password: str) -> str:
    """`url` (redis://[...@]host:port/db) with role's user and password."""
    scheme, _, rest = url.partition("://")
    host = rest.rsplit("@", 1)[-1]
    return f"{scheme}://{user_name(role)}:{password}@{host}"
