"""Who may see what: a stored response or conversation belongs to the credential
that created it, and the requests that need the store when it is off are refused, not served
without it."""

from __future__ import annotations

import hashlib
from typing import Any

from proxy.errors import ClientError
from proxy.harmony.history import chain as history

#: No credential: one scope shared by every such request.
SHARED_SCOPE = "shared"


def scope_of(headers: list[tuple[bytes, bytes]], header: str) -> str:
    """The scope of a request (module docstring); `header` is lower-case."""
    wanted = header.encode("latin-1")
    for name, raw in headers:
        if name.lower() != wanted:
            continue
        value = raw.decode("latin-1").strip()
        if header == "authorization":
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer":
                value = token.strip()
        if value:
            return hashlib.sha256(value.encode("latin-1")).hexdigest()
    return SHARED_SCOPE


def refuse_without_store(body: dict[str, Any]) -> None:
    """`store_url = off`: what needs the store is a 400, never silently dropped."""
    if body.get("background") is True:
        raise ClientError(
            "background responses need the response store, which is off on this proxy "
            "(store_url = off)",
            param="background",
            code="unsupported_parameter",
        )
    for index, ref in history.references(body.get("input")):
        raise ClientError(
            f"Item with id '{ref[:100]}' cannot be looked up: the response store is off on "
            "this proxy (store_url = off); send the item itself",
            param=f"input[{index}].id",
            code="unsupported_parameter",
        )
