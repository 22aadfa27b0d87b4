"""How a setting is declared (`setting()`, a field of settings.py's `Settings`), and the value
types of settings: each parser takes one raw string and raises `ValueError` with a short reason,
which sources.py turns into an error naming the setting, its source and the value."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Spec:
    """What a setting's field carries besides its type and default."""

    parse: Callable[[str], Any]
    help: str
    aliases: tuple[str, ...] = ()
    #: Its value never appears in an error message or a repr (keys).
    secret: bool = False
    #: A value shown in the example file: for a setting unset by default, in place of the
    #: default; else as an alternative to it.
    example: Any = None
    #: Words for the example file only, after the help.
    note: str = ""


def setting(
    default: _T,
    parse: Callable[[str], _T],
    help: str,
    *,
    aliases: tuple[str, ...] = (),
    secret: bool = False,
    example: Any = None,
    note: str = "",
) -> _T:
    """Declare a field of `Settings` (typed as its default, as `dataclasses.field` is)."""
    spec = Spec(parse, help, aliases, secret, example, note)
    return dataclasses.field(default=default, repr=not secret, metadata={"spec": spec})


# -- value types -------------------------------------------------------------------------------


def url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("must be an http(s) URL such as http://127.0.0.1:8000")
    return value.rstrip("/")


def positive_float(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise ValueError("must be a number of seconds above 0")
    return number


def fraction(value: str) -> float:
    number = float(value)
    if not 0 <= number <= 1:
        raise ValueError("must be a number from 0 to 1")
    return number


def non_negative_float(value: str) -> float:
    number = float(value)
    if not number >= 0:
        raise ValueError("must be a number of seconds, 0 or more")
    return number


def non_negative_int(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError("must be 0 or more")
    return number


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError("must be 1 or more")
    return number


def workers(value: str) -> int:
    if value.strip().lower() == "auto":
        return 0  # resolved at start (proxy/server/processes/cpus.py)
    number = int(value)
    if number < 0:
        raise ValueError("must be a number of processes, or auto")
    return number


def addresses(value: str) -> tuple[str, ...]:
    entries = tuple(part.strip() for part in value.split(",") if part.strip())
    for entry in entries:
        if entry == "*":
            continue
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(
                f"{entry[:100]!r} is not an IP address or CIDR block (or * for any peer)"
            ) from None
    return entries


def port(value: str) -> int:
    number = int(value)
    if not 0 <= number <= 65535:
        raise ValueError("must be a port number 0-65535 (0 picks a free port)")
    return number


def boolean(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")


def globs(value: str) -> tuple[str, ...]:
    globs = tuple(part.strip() for part in value.split(",") if part.strip())
    if not globs:
        raise ValueError("must list at least one model name or glob (use * for all)")
    return globs


def names(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def header_name(value: str) -> str:
    name = value.strip().lower()
    if not name or any(c.isspace() or c in ':()<>@,;\\"/[]?={}' for c in name):
        raise ValueError("must be an HTTP header name such as authorization or x-api-key")
    return name


def choice(*choices: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    parse.__name__ = "one of " + "|".join(choices)
    return parse
