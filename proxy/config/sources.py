"""Where settings come from: defaults < config file (TOML) < environment (`PROXY_<NAME>`) < CLI
flags (`--<name-with-dashes>`), each named after its field of `Settings`. A bad value is a
`ConfigError` naming the setting, its source and the value (never a secret's)."""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.config.settings import Settings
from proxy.config.values import Spec

ENV_PREFIX = "PROXY_"
CONFIG_ENV = "PROXY_CONFIG"


class ConfigError(ValueError):
    """A setting has a bad value; the message names the setting, its source and the value."""


@dataclass(frozen=True, slots=True)
class Field:
    """One setting as the sources see it: a field of `Settings` and its `Spec`."""

    name: str
    default: Any
    spec: Spec

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


#: Every setting, in declaration order.
FIELDS: tuple[Field, ...] = tuple(
    Field(field.name, field.default, field.metadata["spec"])
    for field in dataclasses.fields(Settings)
)


def _parse(field: Field, raw: Any, source: str) -> Any:
    text = ",".join(map(str, raw)) if isinstance(raw, list) else str(raw)
    if isinstance(raw, bool):
        text = "true" if raw else "false"
    try:
        return field.spec.parse(text)
    except ValueError as exc:
        shown = "<secret>" if field.spec.secret else repr(text)
        raise ConfigError(f"{source}={shown}: {exc}") from None


def load_file(path: Path) -> dict[str, Any]:
    """Read a TOML config file (keys are setting names)."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"config file {str(path)!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r}: {exc}") from None
    known = {field.name for field in FIELDS}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"config file {str(path)!r}: unknown setting(s) {', '.join(unknown)}")
    return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One `--flag` per setting (values parsed later, so errors read the same for every source)."""
    parser.add_argument("--config", help=f"TOML config file (also {CONFIG_ENV})")
    for field in FIELDS:
        parser.add_argument(
            field.flag, *field.spec.aliases, dest=field.name, default=None, help=field.spec.help
        )


def parse_flags(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def load_settings(
    env: Mapping[str, str], args: argparse.Namespace | None = None, *, base: Settings | None = None
) -> Settings:
    """Settings from (lowest first) `base` defaults, the config file, `env`, then CLI `args`."""
    values: dict[str, Any] = {}
    config_path = getattr(args, "config", None) or env.get(CONFIG_ENV)
    file_values = load_file(Path(config_path)) if config_path else {}
    for field in FIELDS:
        flag_value = getattr(args, field.name, None) if args is not None else None
        if flag_value is not None:
            values[field.name] = _parse(field, flag_value, field.flag)
        elif env.get(field.env) not in (None, ""):
            values[field.name] = _parse(field, env[field.env], field.env)
        elif field.name in file_values:
            values[field.name] = _parse(
                field, file_values[field.name], f"{config_path}:{field.name}"
            )
    return dataclasses.replace(base or Settings(), **values)
