"""Secret settings read from files (MAGIC_<FIELD>_FILE), as the Helm chart passes them."""

from __future__ import annotations

import pytest
import redis

from magic.config.settings import ServiceSettings
from magic.controller.settings import ClientSettings, ControllerSettings
from magic.reward.settings import RewardSettings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ("MAGIC_REDIS_URL", "MAGIC_REDIS_PASSWORD", "MAGIC_API_TOKEN"):
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(f"{var}_FILE", raising=False)


def secret(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_password_file_goes_into_the_url_of_the_named_user(tmp_path, monkeypatch):
    monkeypatch.setenv("MAGIC_REDIS_URL", "redis://magic-rollout@redis.ml:6379/0")
    monkeypatch.setenv("MAGIC_REDIS_PASSWORD_FILE", secret(tmp_path, "pw", "s3cr/t:@x\n"))
    s = ServiceSettings()
    assert s.redis_url == "redis://magic-rollout:s3cr%2Ft%3A%40x@redis.ml:6379/0"
    kw = redis.connection.parse_url(s.redis_url)  # what the clients connect with
    assert (kw["username"], kw["password"], kw["host"]) == ("magic-rollout", "s3cr/t:@x", "redis.ml")
    assert "s3cr" not in repr(s.redis_password)


def test_password_without_a_user_is_the_default_users(tmp_path, monkeypatch):
    monkeypatch.setenv("MAGIC_REDIS_URL", "redis://redis:6379/0")
    monkeypatch.setenv("MAGIC_REDIS_PASSWORD_FILE", secret(tmp_path, "pw", "abc"))
    assert ServiceSettings().redis_url == "redis://:abc@redis:6379/0"


def test_url_file_and_token_file(tmp_path, monkeypatch):
    monkeypatch.setenv("MAGIC_REDIS_URL_FILE", secret(tmp_path, "url", "rediss://:pw@ext:6380/2\n"))
    monkeypatch.setenv("MAGIC_API_TOKEN_FILE", secret(tmp_path, "token", "t" * 32 + "\n"))
    assert ControllerSettings().redis_url == "rediss://:pw@ext:6380/2"
    assert ControllerSettings().api_token.get_secret_value() == "t" * 32
    assert RewardSettings().api_token.get_secret_value() == "t" * 32
    assert ClientSettings().api_token.get_secret_value() == "t" * 32
    # only the declared secret settings have a file twin
    monkeypatch.setenv("MAGIC_LOG_LEVEL_FILE", secret(tmp_path, "lvl", "DEBUG"))
    assert ServiceSettings().log_level == "INFO"


def test_plain_variables_still_work(monkeypatch):
    monkeypatch.setenv("MAGIC_REDIS_URL", "redis://:pw@h:1/0")
    monkeypatch.setenv("MAGIC_API_TOKEN", "x" * 20)
    assert ControllerSettings().redis_url == "redis://:pw@h:1/0"
    assert ControllerSettings().api_token.get_secret_value() == "x" * 20


@pytest.mark.parametrize(
    "env, message",
    [
        ({"MAGIC_API_TOKEN": "x" * 20, "MAGIC_API_TOKEN_FILE": "FILE"}, "both MAGIC_API_TOKEN and MAGIC_API_TOKEN_FILE are set"),
        ({"MAGIC_API_TOKEN_FILE": "/nonexistent/token"}, "MAGIC_API_TOKEN_FILE=/nonexistent/token: cannot read the secret file"),
        ({"MAGIC_REDIS_URL": "redis://:one@h:1/0", "MAGIC_REDIS_PASSWORD_FILE": "FILE"}, "already holds a password"),
    ],
)
def test_bad_secret_settings_say_what_to_change(tmp_path, monkeypatch, env, message):
    path = secret(tmp_path, "f", "y" * 20)
    for var, value in env.items():
        monkeypatch.setenv(var, path if value == "FILE" else value)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        ControllerSettings()


def test_token_file_is_validated_like_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("MAGIC_API_TOKEN_FILE", secret(tmp_path, "token", "short"))
    with pytest.raises(ValueError, match="at least 16"):
        ControllerSettings()
