"""Least privilege on the bus: each service reaches Redis as its own ACL user, which may run only
the commands its job needs on only the keys its job needs (Redis 7 ACL selectors: each
`(key patterns, commands)` pair is a grant, `%R~` a read-only pattern; a command is allowed when
one grant holds the command and every key it names).

    rollout     consumes `prompts` (read, acknowledge, claim from dead rollout workers), appends
                `rollouts`, records the version it serves (`weight_versions`), follows `weights`
    reward      consumes `rollouts`, appends `scored` and `estimates`
    learner     consumes `scored`, announces on `weights`, commits steps (its `learner` hash),
                holds the learner lease (its epoch counter, its own write counter `seq:learner`)
    controller  owns the run: every key of every run, the run index and the active-run pointer

Every worker role also reads what it must check (the run's spec and state, step records, group
digests, the learner epoch, heartbeats), appends its own events (`events:<role>`: the controller
knows who sent each one) and dead letters (`dead:<role>`), and sets or deletes heartbeats of its
own service. Nothing else: no role reads, claims, acknowledges, trims or deletes a stream of
another role, and only the controller changes a run's state, spec or its write counter `seq`.
What an ACL cannot express — an entry's size, a heartbeat's freshness, a key created before
its run — the reader checks (`docs/security.md`, "The bus"). The same matrix is stated there and
tests/integration/test_acl_matrix.py probes a real Redis with each role's credentials against it.

`rules(role, password)` gives the `ACL SETUSER` arguments; `create_users(r, passwords)` applies
them (`magic local`, the tests); the Helm chart renders the same rules into Redis's ACL file
(`acl_file_template`). The default user keeps full access for the operator; give it a password.
"""

from __future__ import annotations

import redis

from magic.protocol.keys import ROLES

_RUN = "magic:{*}"

_CONNECTION = "+ping +hello +auth +select +client|setname +client|id +echo"
_ROOT = f"{_CONNECTION} +multi +exec +discard +unwatch +scan"
"""Keyless commands every worker role may run (SCAN: finding heartbeats; a key's name is no secret)."""

_READ_STRING = "+get +exists +type +pttl +ttl +watch"
_READ_HASH = "+hget +hmget +hgetall +hkeys +hlen +hexists +exists +type +watch"
_READ_STREAM = "+xrange +xrevrange +xread +xlen +xinfo|stream +exists +type"
_CONSUME = (
    "+xreadgroup +xack +xclaim +xautoclaim +xpending +xinfo|consumers +xinfo|groups "
    "+xgroup|create +xgroup|createconsumer +xgroup|delconsumer"
)
_SCRIPT = "+eval +evalsha"


def _grant(patterns: str, commands: str) -> str:
    """A selector: the commands allowed on the keys of `patterns` (`%R~` read-only)."""
    return f"({patterns} {commands})"


def _run(*names: str, read_only: bool = False) -> str:
    return " ".join(f"{'%R' if read_only else ''}~{_RUN}:{name}" for name in names)


def _worker(role: str, consumes: str, appends: tuple[str, ...]) -> list[str]:
    """What every worker role holds: its consumer group on `consumes`, appends to `appends`, to its
    own events and dead letters (and the once-only record of poison it met on a fan-out stream),
    its service's heartbeats, and the reads it checks with."""
    return [
        _ROOT,
        _grant(_run(consumes), f"{_READ_STREAM} {_CONSUME}"),
        *(_grant(_run(name), "+xadd") for name in appends),
        _grant(_run(f"events:{role}", f"dead:{role}"), "+xadd"),
        _grant(_run(f"dead:{role}:seen"), "+sadd"),
        _grant(_run(f"dead:{role}:seen", f"dead:{role}"), _SCRIPT),  # the once-only dead letter (`Stream.dead_letter_once`)
        _grant(f"~magic:hb:{role}:*", "+set +del"),
        _grant("%R~magic:hb:*", _READ_STRING),
        _grant("%R~magic:active_run " + _run("spec", "epoch:learner", "seq", "seq:learner", read_only=True), _READ_STRING),
        _grant(_run("state", "step:*", "groups:*", read_only=True), _READ_HASH),
    ]


_FOLLOWS_WEIGHTS = [
    _grant(_run("weights", read_only=True), _READ_STREAM),  # announcements (`magic.weights`)
    _grant(_run("weight_versions", read_only=True), _READ_HASH),  # the version each rollout worker serves
]


RULES: dict[str, list[str]] = {
    "controller": ["~magic:*", "+@all", "-@dangerous", "-@admin", _CONNECTION],
    "rollout": [*_worker("rollout", "prompts", ("rollouts",)), *_FOLLOWS_WEIGHTS, _grant(_run("weight_versions"), "+hset")],
    "reward": _worker("reward", "rollouts", ("scored", "estimates")),
    "learner": [
        *_worker("learner", "scored", ("weights",)),
        *_FOLLOWS_WEIGHTS,
        _grant(_run("learner"), f"{_READ_HASH} +hset +hdel"),  # its committed progress (`magic.store.steps`)
        _grant(_run("lease:learner"), f"{_READ_STRING} +set +pexpire +del"),  # its lease (`magic.store.lease`)
        _grant(_run("epoch:learner", "seq:learner"), f"{_READ_STRING} +incr"),  # counters: INCR only (not INCRBY, which could lower them), never reset
        _grant(_run("lease:learner", "epoch:learner"), _SCRIPT),  # acquire / renew / release scripts
    ],
}
"""Each role's grants (after `reset`: no keys, no commands). The controller's: every key under
`magic:`, every command but the dangerous and administrative ones."""


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
