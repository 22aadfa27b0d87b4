"""Which MCP server URLs the proxy may reach: the operator's allow-list and the address check.

A request names the server; the proxy then connects from inside the operator's network. So by
default no server is allowed (an operator opts in with URL prefixes or host names), and a host
that resolves to a loopback, link-local, private or otherwise non-global address is refused
unless the operator allows private addresses — checked after DNS resolution, on every address
the name has, so a public name pointing inside is refused too.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit


class Refused(ValueError):
    """The server URL is not allowed; `code` is the error code the client sees (400)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Policy:
    """`allowed`: URL prefixes (with a scheme) or bare host names; `allow_private`: let a host
    resolve to loopback, link-local or private addresses."""

    allowed: tuple[str, ...] = ()
    allow_private: bool = False

    def check_url(self, url: str) -> str:
        """The host of an allowed `url`; `Refused` for a malformed or unlisted one."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise Refused("invalid_mcp_server_url", "server_url must be an http(s) URL with a host")
        if parts.username or parts.password:
            raise Refused(
                "invalid_mcp_server_url", "server_url may not carry credentials; use headers"
            )
        host = parts.hostname.lower()
        if not any(_matches(entry, url, host) for entry in self.allowed):
            raise Refused(
                "mcp_server_not_allowed",
                "this MCP server is not in the proxy's allow-list (mcp_allowed_servers)",
            )
        return host

    async def check(self, url: str) -> None:
        """`check_url`, then every address the host resolves to (`Refused` if any is private)."""
        host = self.check_url(url)
        if self.allow_private:
            return
        port = urlsplit(url).port or (443 if url.lower().startswith("https") else 80)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            raise Refused(
                "mcp_server_unresolved", "the MCP server's host does not resolve"
            ) from exc
        for info in infos:
            address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
            if not address.is_global:
                raise Refused(
                    "mcp_server_private_address",
                    "the MCP server resolves to a loopback, link-local or private address, "
                    "which the proxy refuses (mcp_allow_private_addresses)",
                )


def _matches(entry: str, url: str, host: str) -> bool:
    """A URL prefix matches the URL's start (case-insensitively in scheme and host, at a path
    boundary); a bare entry matches the host name exactly."""
    entry = entry.strip()
    if "://" not in entry:
        return entry.lower() == host
    prefix = urlsplit(entry)
    target = urlsplit(url)
    if (prefix.scheme.lower(), prefix.netloc.lower()) != (
        target.scheme.lower(),
        target.netloc.lower(),
    ):
        return False
    base = prefix.path.rstrip("/")
    return target.path == base or target.path.startswith(base + "/") or not base
