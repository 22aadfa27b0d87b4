"""Everything the proxy does not repair goes to upstream untouched, streamed both ways.

Method, path, query and body go up as received; status, headers (hop-by-hop ones dropped) and
body come back as upstream sends them, chunk by chunk, so SSE (a chat completion, a completion)
is never buffered. The target is always the configured upstream: only the path and query of the
client's request are used, never a host or an absolute URL it names.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import Scope, Send

from proxy.errors import ProxyError
from proxy.metrics import CLIENT_TIMEOUT, Metrics
from proxy.server import asgi
from proxy.upstream.client import Upstream, end_to_end


def target_of(scope: Scope, path_prefix_strip: str = "") -> str:
    """The origin-form target for upstream: `/path?query`, never an absolute URL."""
    path: str = scope.get("raw_path", b"").decode("latin-1") or scope["path"]
    path = path.split("?", 1)[0]
    if path_prefix_strip and path.startswith(path_prefix_strip):
        path = path[len(path_prefix_strip) :] or "/"
    # "//host/x" would read as a network-path reference: keep it a path on our upstream.
    path = "/" + path.lstrip("/")
    query: bytes = scope.get("query_string", b"")
    return path + ("?" + query.decode("latin-1") if query else "")


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


async def forward(
    scope: Scope,
    inbound: asgi.Inbound,
    send: Send,
    *,
    upstream: Upstream,
    metrics: Metrics,
    request_id: str,
    timeout: float,
    send_timeout: float,
    max_body_bytes: int,
    log: Callable[..., None],
    started: float,
    monotonic: Callable[[], float],
    body: bytes | None = None,
    path_prefix_strip: str = "",
) -> None:
    """Pass one request through; `body` when it was already read (a /v1/responses we skip)."""
    target = target_of(scope, path_prefix_strip)
    headers = [
        *[(n, v) for n, v in asgi.header_pairs(scope) if n.lower() != asgi.REQUEST_ID],
        (asgi.REQUEST_ID, request_id),
    ]
    if body is None:
        body = b"" if not _has_body(scope) else None
        if body is not None:
            await inbound.body(max_body_bytes)  # consume the (empty) request message
    content = body if body is not None else inbound.stream_body(max_body_bytes)
    status = 502
    timed_send = asgi.with_send_timeout(send, send_timeout)

    async def relay() -> None:
        nonlocal status
        async with upstream.forward(
            scope["method"], target, headers, content, timeout=timeout
        ) as answer:
            status = answer.status_code
            response_headers = [
                (name.encode("latin-1"), value.encode("latin-1"))
                for name, value in end_to_end(answer.headers.multi_items())
                if name.lower() != asgi.REQUEST_ID
            ]
            response_headers.append((b"x-request-id", request_id.encode()))
            await timed_send(
                {"type": "http.response.start", "status": status, "headers": response_headers}
            )
            async for chunk in answer.aiter_raw():
                await timed_send({"type": "http.response.body", "body": chunk, "more_body": True})
            await timed_send({"type": "http.response.body", "body": b"", "more_body": False})

    disconnected = False
    try:
        disconnected = await asgi.run_until_disconnect(inbound, relay())
    except ProxyError as error:
        status = error.status
        await asgi.send_error(send, error, [(b"x-request-id", request_id.encode())])
    except asgi.ClientDisconnected:
        disconnected = True
    except asgi.SendTimeout:
        disconnected = True
        metrics.timeouts.labels(CLIENT_TIMEOUT).inc()
    if disconnected:
        metrics.disconnects.labels("passthrough").inc()
    metrics.passthrough.labels(f"{status // 100}xx").inc()
    log(
        "request",
        request_id=request_id,
        route="passthrough",
        method=scope["method"],
        path=scope["path"],
        status=status,
        disconnected=disconnected,
        duration_ms=round((monotonic() - started) * 1000, 2),
    )
