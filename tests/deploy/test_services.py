"""What the chart relies on in the services, checked on real processes over a real Redis that
requires a password (as the chart's Redis does): no password in the logs, each process exporting
only the series it owns, and the `helm test` script (charts/magic/files/smoke_test.py) passing on
a working install and failing on a broken one."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
from waiting import wait_for

from magic.local.redis_server import RedisServer
from magic.local.supervisor import Supervisor
from magic.runtime.ports import free_port

from .conftest import CHART, ROOT

pytestmark = pytest.mark.deploy

PASSWORD = "Pw-0f-the.redis_server~x9"
TOKEN = "tok-" + "k" * 28
SMOKE_TEST = CHART / "files" / "smoke_test.py"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A password-protected Redis, the controller and one reward worker, given their secrets as the
    chart does (files named by MAGIC_*_FILE); yields (ports, supervisor, redis url without password)."""
    tmp = tmp_path_factory.mktemp("secured")
    server = RedisServer().start()
    import redis

    redis.Redis(port=server.port).config_set("requirepass", PASSWORD)
    url = f"redis://127.0.0.1:{server.port}/0"
    ports = {"controller": free_port(), "reward": free_port()}
    files = {"MAGIC_REDIS_URL": url, "MAGIC_REDIS_PASSWORD_FILE": secret_file(tmp, "redis-password", PASSWORD)}
    sup = Supervisor(tmp / "logs", {**files, "MAGIC_DATA_DIR": str(tmp / "data"), "MAGIC_LOG_LEVEL": "DEBUG"})
    try:
        token = {"MAGIC_API_TOKEN_FILE": secret_file(tmp, "api-token", TOKEN)}
        sup.start("controller", "magic.controller", {"MAGIC_PORT": str(ports["controller"]), **token, "MAGIC_READ_REQUIRES_TOKEN": "true"})
        sup.start("reward-0", "magic.reward", {"MAGIC_METRICS_PORT": str(ports["reward"])})
        wait_for(lambda: "up (redis" in sup.get("reward-0").log_tail(200), 120, "the reward worker to start", sup)
        wait_for(lambda: _get(ports["controller"], "/readyz") == 200, 120, "the controller to be ready", sup)
        yield ports, sup, url
    finally:
        sup.stop_all()
        server.stop()


def secret_file(directory, name: str, value: str) -> str:
    """A Secret's key as the chart mounts it (a file, with the trailing newline an edited file has)."""
    path = directory / name
    path.write_text(value + "\n")
    return str(path)


def _get(port: int, path: str) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5).status_code
    except httpx.HTTPError:
        return None


def test_no_process_logs_the_redis_password(stack):
    ports, sup, url = stack
    logs = {s.name: s.log_path.read_text(errors="replace") for s in sup.services}
    assert "up (redis redis://:***@127.0.0.1" in logs["reward-0"]
    for name, text in logs.items():
        assert PASSWORD not in text, f"{name} logged the Redis password"


def series(text: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("magic_")}


def test_each_process_exports_only_its_own_series_and_no_unset_gauge(stack):
    ports, _, _ = stack
    controller = series(httpx.get(f"http://127.0.0.1:{ports['controller']}/metrics").text)
    reward = series(httpx.get(f"http://127.0.0.1:{ports['reward']}/metrics").text)
    # no run is active: no figure is known yet, so no gauge has a sample (not a fake 0)
    for gauge in ("magic_stage", "magic_policy_version", "magic_context_length", "magic_policy_entropy", "magic_entropy_coef"):
        assert gauge not in controller | reward, gauge
    # each process exports only what its service computes
    assert not {s for s in reward if s.startswith(("magic_rollout_", "magic_weight_load_", "magic_learner_"))}, reward
    assert not {s for s in controller if s.startswith(("magic_rollout_", "magic_reward_", "magic_sandbox_", "magic_weight_load_"))}, controller
    assert "magic_errors_total" in reward  # a counter its service declares: a true 0


def run_smoke_test(api: str, token: str, redis_url: str, password: str, tmp_path) -> subprocess.CompletedProcess:
    """The helm test pod's script with its environment: the token and the password as files."""
    secrets = {"MAGIC_API_TOKEN_FILE": secret_file(tmp_path, "api-token", token), "MAGIC_REDIS_PASSWORD_FILE": secret_file(tmp_path, "redis-password", password)}
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAGIC_")}
    env.update({"MAGIC_API": api, "MAGIC_REDIS_URL": redis_url, **secrets, "PYTHONPATH": str(ROOT / "services")})
    return subprocess.run([sys.executable, str(SMOKE_TEST)], env=env, capture_output=True, text=True, timeout=120)


def test_helm_test_script_passes_on_a_working_install(stack, tmp_path):
    ports, _, url = stack
    done = run_smoke_test(f"http://127.0.0.1:{ports['controller']}", TOKEN, url, PASSWORD, tmp_path)
    assert done.returncode == 0, done.stderr
    assert '"passed": true' in done.stdout


def test_helm_test_script_fails_on_a_broken_install(stack, tmp_path):
    ports, _, url = stack
    api = f"http://127.0.0.1:{ports['controller']}"
    wrong_token = run_smoke_test(api, "x" * 32, url, PASSWORD, tmp_path)
    assert wrong_token.returncode == 1 and "token:" in wrong_token.stderr, wrong_token.stderr
    wrong_password = run_smoke_test(api, TOKEN, url, "not-the-password", tmp_path)
    assert wrong_password.returncode == 1 and "redis:" in wrong_password.stderr, wrong_password.stderr
    assert "not-the-password" not in wrong_password.stderr + wrong_password.stdout
    no_controller = run_smoke_test(f"http://127.0.0.1:{free_port()}", TOKEN, url, PASSWORD, tmp_path)
    assert no_controller.returncode == 1 and "controller:" in no_controller.stderr, no_controller.stderr
