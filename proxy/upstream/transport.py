"""How the lean client reaches upstream: a `Transport` opens a byte stream for a new connection.

`TCPTransport` is the real one: TCP to the base URL's host and port, TLS for an https upstream
(verified against the certificates `tls_context` names), never through a forward proxy (upstream
is the server next to the proxy: a sidecar's localhost, a cluster service). Tests inject their
own through the same seam (`Upstream(transport=...)`, `create_app(transport=...)`), as httpcore's
network backends are injected: the client's HTTP, pool and errors stay the real ones.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Mapping
from typing import Protocol

import certifi

from proxy.upstream.connection import Connection


class Transport(Protocol):
    """Opens byte streams to upstream for the lean client (`proxy.upstream.stream`)."""

    async def connect(self, connection: Connection) -> None:
        """Open a byte stream to upstream and attach `connection` to it (asyncio's
        `connection_made`); raise `OSError` when it cannot (refused, unreachable, TLS). The
        client times the call."""
        ...


class TCPTransport:
    """TCP (and TLS for `ssl_context`) to `host`:`port`."""

    __slots__ = ("_host", "_port", "_ssl")

    def __init__(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> None:
        self._host = host
        self._port = port
        self._ssl = ssl_context

    async def connect(self, connection: Connection) -> None:
        await asyncio.get_running_loop().create_connection(
            lambda: connection,
            self._host,
            self._port,
            ssl=self._ssl,
            server_hostname=self._host if self._ssl is not None else None,
        )


def tls_context(env: Mapping[str, str] = os.environ) -> ssl.SSLContext:
    """The certificates an https upstream is verified against: the file `SSL_CERT_FILE` or the
    directory `SSL_CERT_DIR` names (an operator's private CA), else certifi's bundle — the
    choice httpx makes, so a deployment's trust does not depend on which client is used."""
    if env.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=env["SSL_CERT_FILE"])
    if env.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=env["SSL_CERT_DIR"])
    return ssl.create_default_context(cafile=certifi.where())
