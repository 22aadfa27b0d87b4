"""Settings: precedence, errors naming the setting and value, and the docs kept in step."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from proxy.config.generated import _toml, example_toml, settings_table
from proxy.config.settings import Settings
from proxy.config.sources import FIELDS, ConfigError, _parse, load_settings, parse_flags

ROOT = Path(__file__).parent.parent


def test_defaults() -> None:
    settings = load_settings({})
    assert settings == Settings()
    assert settings.upstream_url is None
    assert settings.port == 8080
    assert settings.repairs("anything")


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text('port = 9000\nrepair_models = ["openai/gpt-oss-*"]\nidle_timeout = 7\n')
    env = {"PROXY_CONFIG": str(config), "PROXY_PORT": "9100"}
    settings = load_settings(env, parse_flags(["--idle-timeout", "3.5"]))
    assert settings.port == 9100  # env beats the file
    assert settings.idle_timeout == 3.5  # flag beats both
    assert settings.repair_models == ("openai/gpt-oss-*",)
    assert settings.repairs("openai/gpt-oss-120b")
    assert not settings.repairs("llama-3")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PROXY_PORT": "http"}, "PROXY_PORT='http'"),
        ({"PROXY_PORT": "70000"}, "PROXY_PORT='70000': must be a port"),
        ({"PROXY_UPSTREAM_URL": "localhost:8000"}, "PROXY_UPSTREAM_URL='localhost:8000'"),
        ({"PROXY_IDLE_TIMEOUT": "0"}, "PROXY_IDLE_TIMEOUT='0': must be a number"),
        ({"PROXY_LOG_FORMAT": "xml"}, "PROXY_LOG_FORMAT='xml': must be one of json, text"),
        ({"PROXY_PASSTHROUGH_WHEN_INCAPABLE": "maybe"}, "must be true or false"),
        ({"PROXY_REPAIR_MODELS": " , "}, "PROXY_REPAIR_MODELS"),
        ({"PROXY_CONFIG": "/nonexistent/proxy.toml"}, "config file '/nonexistent/proxy.toml'"),
    ],
)
def test_bad_values_name_the_setting_and_value(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(env)


def test_bad_flag_and_unknown_file_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("--max-body-bytes='-1': must be 0 or more")):
        load_settings({}, parse_flags(["--max-body-bytes", "-1"]))
    config = tmp_path / "bad.toml"
    config.write_text("prot = 1\n")
    with pytest.raises(ConfigError, match="unknown setting"):
        load_settings({"PROXY_CONFIG": str(config)})


def test_every_default_is_a_value_its_parser_gives() -> None:
    # A default written as a setting's raw text (as the example file shows it) parses back to
    # itself: the default, the parser and the documented value cannot drift apart.
    for field in FIELDS:
        if field.default is None or field.default == ():
            continue
        raw = tomllib.loads(f"value = {_toml(field.default)}")["value"]
        assert _parse(field, raw, field.name) == field.default, field.name


def test_a_secret_is_never_shown() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"PROXY_REASONING_KEYS": "k1:c2VjcmV0LXZhbHVl"})
    assert "c2VjcmV0LXZhbHVl" not in str(caught.value)
    assert "PROXY_REASONING_KEYS=<secret>" in str(caught.value)
    assert "reasoning_keys" not in repr(Settings())


def test_docs_table_and_example_config_list_every_setting() -> None:
    docs = (ROOT / "docs" / "settings.md").read_text()
    assert settings_table() in docs, "docs/settings.md table is stale: paste settings_table()"
    example = (ROOT / "config" / "proxy.example.toml").read_text()
    assert example == example_toml(), (
        "config/proxy.example.toml is stale: regenerate it with .venv/bin/python -c "
        "'from proxy.config.generated import example_toml; print(example_toml(), end=\"\")' "
        "> config/proxy.example.toml"
    )
    for field in FIELDS:
        assert re.search(rf"^# ?{field.name} = ", example, re.M), f"{field.name} not in example"
    assert (
        load_settings({"PROXY_CONFIG": str(ROOT / "config" / "proxy.example.toml")}) == Settings()
    )


def test_example_config_uncommented_is_valid(tmp_path: Path) -> None:
    example = (ROOT / "config" / "proxy.example.toml").read_text()
    uncommented = re.sub(r"^# ?([a-z_]+ = )", r"\1", example, flags=re.M)
    config = tmp_path / "proxy.toml"
    config.write_text(uncommented)
    settings = load_settings({"PROXY_CONFIG": str(config)})
    assert settings.upstream_url == "http://127.0.0.1:8000"
    assert settings.metrics_port == 9090


def test_upstream_alias_flag() -> None:
    settings = load_settings({}, parse_flags(["--upstream", "http://10.0.0.2:8000/"]))
    assert settings.upstream_url == "http://10.0.0.2:8000"


def test_more_bad_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="PROXY_SIMULATOR_TOKEN_SECONDS='-1'"):
        load_settings({"PROXY_SIMULATOR_TOKEN_SECONDS": "-1"})
    assert load_settings({"PROXY_LOG_CONTENT": "yes"}).log_content is True
    assert load_settings({"PROXY_LOG_CONTENT": "off"}).log_content is False
    config = tmp_path / "broken.toml"
    config.write_text("port = \n")
    with pytest.raises(ConfigError, match=r"broken\.toml"):
        load_settings({"PROXY_CONFIG": str(config)})
    config.write_text("log_content = true\nrepair_models = ['a', 'b']\n")
    settings = load_settings({"PROXY_CONFIG": str(config)})
    assert settings.log_content is True
    assert settings.repair_models == ("a", "b")
