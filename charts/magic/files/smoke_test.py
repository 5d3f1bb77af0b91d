"""`helm test`: checks a fresh install from inside the cluster, in the controller's image.

1. the controller answers: GET /readyz is 200 (it reaches Redis) and GET /v1/runs is 200 with the token (the chart requires it on reads);
2. Redis is reachable with the chart's URL and password: PING, then a write/read/delete round trip;
3. the API token works: a mutating request without it is refused (401), with it is let through
   (an empty body: 422, so nothing is created).

Environment: MAGIC_API (the controller's Service URL); the token and Redis as every MAGIC process
reads them (`magic.config.settings`): MAGIC_API_TOKEN or MAGIC_API_TOKEN_FILE, MAGIC_REDIS_URL or
MAGIC_REDIS_URL_FILE, MAGIC_REDIS_PASSWORD_FILE (the chart mounts its Secrets as files).
Exit status 0 when every check passes; otherwise 1, one line per failed check on stderr.
Standard library, `redis` and the `magic` package's settings (the controller's image has both).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request


def http(method: str, url: str, token: str | None = None, body: bytes | None = None, timeout: float = 10) -> int:
    """Status code of one request (no exception for 4xx/5xx)."""
    req = urllib.request.Request(url, data=body, method=method, headers={"content-type": "application/json"})
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def check_controller(api: str, token: str) -> list[str]:
    problems = []
    for path in ("/readyz", "/v1/runs"):  # the chart's controller wants the token on reads too
        try:
            status = http("GET", api + path, token)
        except OSError as exc:
            return [f"controller: GET {path} failed: {exc}"]
        if status != 200:
            problems.append(f"controller: GET {path} answered {status}, expected 200")
    return problems


def check_token(api: str, token: str) -> list[str]:
    problems = []
    try:
        anonymous = http("POST", api + "/v1/runs", None, b"{}")
        wrong = http("POST", api + "/v1/runs", "not-" + token, b"{}")
        right = http("POST", api + "/v1/runs", token, b"{}")
    except OSError as exc:
        return [f"token: POST /v1/runs failed: {exc}"]
    if anonymous != 401 or wrong != 401:
        problems.append(f"token: POST /v1/runs without the token answered {anonymous}, with a wrong one {wrong}; expected 401")
    if right != 422:
        problems.append(f"token: POST /v1/runs with MAGIC_API_TOKEN and an empty body answered {right}, expected 422")
    return problems


def check_redis(url: str) -> list[str]:
    import redis

    key = f"magic:helm-test:{os.getpid()}"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
        client.ping()
        client.set(key, "ok", ex=60)
        value = client.get(key)
        client.delete(key)
    except redis.RedisError as exc:  # the message names host and port, never the password
        return [f"redis: {type(exc).__name__}: {exc}"]
    return [] if value == b"ok" else [f"redis: wrote 'ok' and read back {value!r}"]


def main() -> int:
    from magic.config.settings import ServiceSettings
    from magic.controller.settings import ClientSettings

    api = os.environ["MAGIC_API"].rstrip("/")
    secret = ClientSettings().api_token
    token = secret.get_secret_value() if secret else ""
    problems = check_controller(api, token) + check_token(api, token) + check_redis(ServiceSettings().redis_url)
    for problem in problems:
        print(problem, file=sys.stderr)
    print(json.dumps({"passed": not problems, "failures": len(problems)}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
