"""What is generated from the declaration of the settings: the settings table of the docs
(`docs/settings.md`) and the commented example file (`config/proxy.example.toml`); tests keep
both files in step."""

from __future__ import annotations

import json
import textwrap
from typing import Any

from proxy.config.sources import CONFIG_ENV, ENV_PREFIX, FIELDS


def settings_table() -> str:
    """The docs' settings table (Markdown)."""
    rows = ["| setting | env | flag | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for field in FIELDS:
        default = field.default
        if isinstance(default, tuple):
            default = ",".join(default) if default else "(none)"
        elif default is None:
            default = "(unset)"
        elif isinstance(default, bool):
            default = str(default).lower()
        rows.append(
            f"| `{field.name}` | `{field.env}` | `{field.flag}` | `{default}` | {field.spec.help} |"
        )
    return "\n".join(rows)


EXAMPLE_HEADER = f"""\
# responses-repair-proxy configuration (TOML). Every setting, commented out at its default.
# Use it with `responses-repair-proxy serve --config FILE` or {CONFIG_ENV}=FILE.
# Precedence, lowest first: this file < environment ({ENV_PREFIX}<NAME>) < command-line flags.
# Generated from proxy/config/settings.py (proxy.config.generated); edit the settings there.
"""


def example_toml() -> str:
    """`config/proxy.example.toml`: every setting with its help, commented out at its default
    (or at its example, when it is unset by default)."""
    blocks = [EXAMPLE_HEADER]
    for field in FIELDS:
        spec = field.spec
        text = f"{spec.help}. {spec.note}" if spec.note else spec.help
        lines = textwrap.wrap(text, width=98, break_long_words=False, break_on_hyphens=False)
        flags = ", ".join((field.flag, *spec.aliases))
        lines.append(f"env {field.env}, flag {flags}")
        if spec.example is None:
            lines.append(f"{field.name} = {_toml(field.default)}")
        elif field.default in (None, ()):
            lines.append(f"{field.name} = {_toml(spec.example)}  # (unset by default)")
        else:
            lines.append(f"{field.name} = {_toml(field.default)}  # or {_toml(spec.example)}")
        blocks.append("\n".join(f"# {line}" for line in lines) + "\n")
    return "\n".join(blocks)


def _toml(value: Any) -> str:
    """A TOML literal of a setting's value (a string, number, boolean or list of strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(map(_toml, value)) + "]"
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's
