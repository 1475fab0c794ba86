"""API keys (deploy/service/auth.py): from the environment or a key file, never from the config; a Bearer
token is checked against digests only; every refusal names the problem and never shows a key."""
import pickle

import pytest
from pydantic import ValidationError

from actors.errors import InvalidRequestError
from deploy.config import ServiceConfig
from deploy.service.auth import ApiKeys, AuthenticationError

KEY = "sk-live-0123456789abcdef"


def test_with_no_keys_configured_every_request_passes():
    keys = ApiKeys.resolve(environ={})
    assert not keys.required
    keys.check(None)
    keys.check("Bearer anything")


def test_keys_come_from_the_env_var_and_key_files(tmp_path):
    env_file, config_file = tmp_path / "env_keys", tmp_path / "config_keys"
    env_file.write_text("# rotated monthly\nkey-from-env-file\n\n")
    config_file.write_text("key-from-config-file\n")
    keys = ApiKeys.resolve({"SPECFLEET_API_KEYS": f" {KEY} , second-key", "SPECFLEET_API_KEY_FILE": str(env_file)},
                           key_file=str(config_file))
    for key in (KEY, "second-key", "key-from-env-file", "key-from-config-file"):
        keys.check(f"Bearer {key}")
    assert len(keys.digests) == 4


def test_the_bearer_scheme_is_case_insensitive():
    ApiKeys.from_keys([KEY]).check(f"bearer {KEY}")


@pytest.mark.parametrize(
    "authorization, problem",
    [
        (None, "missing API key"),
        ("", "missing API key"),
        (KEY, "must be `Bearer <key>`"),
        (f"Basic {KEY}", "must be `Bearer <key>`"),
        ("Bearer ", "must be `Bearer <key>`"),
        (f"Bearer {KEY}x", "invalid API key"),
        (f"Bearer {KEY[:-1]}", "invalid API key"),
    ],
)
def test_missing_malformed_or_unknown_keys_are_refused_naming_the_problem(authorization, problem):
    with pytest.raises(AuthenticationError) as err:
        ApiKeys.from_keys([KEY]).check(authorization)
    assert problem in str(err.value) and KEY[:8] not in str(err.value)


def test_only_digests_are_kept_so_nothing_shipped_or_printed_holds_a_key():
    keys = ApiKeys.from_keys([KEY])
    assert KEY.encode() not in pickle.dumps(keys)  # what travels to the Serve replica
    assert KEY not in repr(keys) and repr(keys) == "ApiKeys(1 key)"


@pytest.mark.parametrize(
    "environ, field",
    [
        ({"SPECFLEET_API_KEY_FILE": "/nonexistent/keys"}, "SPECFLEET_API_KEY_FILE"),
        ({"SPECFLEET_API_KEYS": "a,,b"}, "api_keys"),
        ({"SPECFLEET_API_KEYS": "has space"}, "api_keys"),
    ],
)
def test_unusable_key_settings_fail_naming_the_setting(environ, field):
    with pytest.raises(InvalidRequestError) as err:
        ApiKeys.resolve(environ)
    assert err.value.field == field and "has space" not in str(err.value)


def test_an_empty_key_file_fails_instead_of_leaving_the_api_open(tmp_path):
    empty = tmp_path / "keys"
    empty.write_text("# no keys yet\n")
    with pytest.raises(InvalidRequestError) as err:
        ApiKeys.resolve({}, key_file=str(empty))
    assert err.value.field == "api_key_file" and "no keys" in err.value.message


@pytest.mark.parametrize("name", ["api_keys", "api_key"])
def test_the_config_refuses_keys_without_echoing_them(name):
    with pytest.raises(ValidationError) as err:
        ServiceConfig.model_validate({name: [KEY]})
    assert "SPECFLEET_API_KEYS" in str(err.value) and KEY not in str(err.value)


def test_the_config_names_a_key_file_and_never_dumps_keys():
    config = ServiceConfig.model_validate({"api_key_file": "/etc/specfleet/keys"})
    assert config.api_key_file == "/etc/specfleet/keys" and "api_keys" not in config.model_dump()


def test_the_admin_token_comes_from_its_env_var_its_file_or_the_default_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert not ApiKeys.admin({}).required  # nothing configured: the admin API is off
    default = tmp_path / ".specfleet" / "admin_token"
    default.parent.mkdir()
    default.write_text("from-default-file\n")
    ApiKeys.admin({}).check("Bearer from-default-file")
    named = tmp_path / "elsewhere"
    named.write_text("# admin\nfrom-named-file\n")
    ApiKeys.admin({"SPECFLEET_ADMIN_TOKEN_FILE": str(named)}).check("Bearer from-named-file")
    from_env = ApiKeys.admin({"SPECFLEET_ADMIN_TOKEN": "from-env", "SPECFLEET_ADMIN_TOKEN_FILE": str(named)})
    from_env.check("Bearer from-env")  # the env var wins
    with pytest.raises(AuthenticationError):
        from_env.check("Bearer from-named-file")


def test_an_unreadable_admin_token_file_fails_naming_the_setting(tmp_path):
    with pytest.raises(InvalidRequestError) as caught:
        ApiKeys.admin({"SPECFLEET_ADMIN_TOKEN_FILE": str(tmp_path / "missing")})
    assert caught.value.field == "SPECFLEET_ADMIN_TOKEN_FILE"
