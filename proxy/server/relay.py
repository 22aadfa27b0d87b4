"""The pass-through relay: everything the proxy does not repair goes to upstream untouched,
streamed both ways (the routes that use it: routes/passthrough.py).

Method, path, query and body go up as received; status, headers (hop-by-hop ones dropped) and
body come back as upstream sends them, chunk by chunk, so SSE (a chat completion, a completion)
is never buffered. The target is always the configured upstream: only the path and query of the
client's request are used, never a host or an absolute URL it names.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from starlette.types import Scope, Send

from proxy.errors import ProxyError, UpstreamError
from proxy.metrics.serving import CLIENT_TIMEOUT, Metrics
from proxy.server import asgi
from proxy.server.deps import ServerState, until_drained
from proxy.tracing import Tracing
from proxy.upstream.client import Upstream, end_to_end
from proxy.upstream.stream import MalformedResponseError, Response, StreamError


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


def _content_length(scope: Scope) -> int | None:
    """The client's Content-Length (its body goes up as is), or None (chunked, then)."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.strip().isdigit():
            return int(value)
    return None


class _Cut(Exception):
    """Upstream's answer broke after our head was sent; `kind` is the metric label, `timeout`
    the `proxy_timeouts_total` kind of a stall."""

    def __init__(self, kind: str, message: str, timeout: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.timeout = timeout


async def forward(
    scope: Scope,
    inbound: asgi.Inbound,
    send: Send,
    *,
    upstream: Upstream,
    metrics: Metrics,
    request_id: str,
    timeout: float,
    idle_timeout: float,
    send_timeout: float,
    max_body_bytes: int,
    log: Callable[..., None],
    started: float,
    monotonic: Callable[[], float],
    body: bytes | None = None,
    path_prefix_strip: str = "",
    state: ServerState | None = None,
    tracing: Tracing | None = None,
) -> None:
    """Pass one request through; `body` when it was already read (a /v1/responses we skip).

    Upstream faults end cleanly. Before our head is sent, upstream unreachable, too
    slow (`timeout`) or answering something that is no valid response is a JSON error (502,
    504). After it, a body that is cut, malformed, stalled (nothing for `timeout` from the
    request, then `idle_timeout` between reads) or followed by stray bytes aborts the
    response (`asgi.ResponseAborted`: the client's connection closes short of the end, never a
    clean end that hides the loss). Either way: this request's one log line and one count in
    `proxy_upstream_errors_total`.

    With `state`, the drain's end ends it as it ends a repaired request: a
    JSON 503 `server_shutting_down` while upstream's head has not come, an abort after it (the
    client sees the cut); logged, never counted as upstream's fault, and never left for
    uvicorn to cancel.
    """
    target = target_of(scope, path_prefix_strip)
    headers = [
        *[(n, v) for n, v in asgi.header_pairs(scope) if n.lower() != asgi.REQUEST_ID],
        (asgi.REQUEST_ID, request_id),
    ]
    if tracing is not None:  # upstream's spans join the server span's trace
        headers = tracing.inject(headers)
        tracing.current().set_attribute("proxy.request_id", request_id)
    length = None
    content: bytes | AsyncIterator[bytes]
    if body is not None:
        content = body
    elif _has_body(scope):
        content, length = inbound.stream_body(max_body_bytes), _content_length(scope)
    else:
        await inbound.body(max_body_bytes)  # consume the (empty) request message
        content = b""
    status = 502
    head_sent = False
    timed_send = asgi.with_send_timeout(send, send_timeout)

    async def relay() -> None:
        nonlocal status, head_sent
        async with upstream.forward(
            scope["method"], target, headers, content, length=length, timeout=timeout
        ) as answer:
            status = answer.status
            response_headers = [
                (name.encode("latin-1"), value.encode("latin-1"))
                for name, value in end_to_end(answer.head.headers)
                if name != asgi.REQUEST_ID
            ]
            response_headers.append((b"x-request-id", request_id.encode()))
            await timed_send(
                {"type": "http.response.start", "status": status, "headers": response_headers}
            )
            head_sent = True
            first = max(0.0, started + timeout - monotonic())
            await _relay_body(answer, timed_send, first, idle_timeout)

    disconnected = False
    error: str | None = None
    work = asgi.run_until_disconnect(inbound, relay())
    try:
        disconnected = await (work if state is None else until_drained(state, work))
    except _Cut as cut:
        error = cut.kind
        metrics.upstream_errors.labels(cut.kind).inc()
        if cut.timeout is not None:
            metrics.timeouts.labels(cut.timeout).inc()
    except ProxyError as failure:
        if head_sent:  # only the drain's end comes after our head: the client sees the cut
            error = failure.code or failure.error_type
        else:  # before our head: a JSON error
            error = await _refuse(send, failure, metrics, request_id)
            status = failure.status
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
        error=error,
        aborted=head_sent and error is not None,
        disconnected=disconnected,
        duration_ms=round((monotonic() - started) * 1000, 2),
    )
    if tracing is not None and error is not None:
        tracing.current().set_attribute("proxy.error_code", error)
    if head_sent and error is not None:
        raise asgi.ResponseAborted(f"upstream's answer broke: {error}")


async def _relay_body(answer: Response, send: Send, first: float, idle: float) -> None:
    """Upstream's body to the client as it arrives; `_Cut` when it breaks."""
    wait, stall = first, "first_token"
    while True:
        try:
            async with asyncio.timeout(wait):
                data = await answer.read()
        except TimeoutError:
            raise _Cut("timeout", f"upstream sent no body for {wait:g} s", stall) from None
        except MalformedResponseError as exc:
            raise _Cut("upstream_bad_response", f"upstream's body is malformed: {exc}") from exc
        except StreamError as exc:
            raise _Cut("upstream_disconnected", f"upstream's body was cut: {exc}") from exc
        if answer.trailing:
            # Its length was wrong, or a response was smuggled after it. Checked before the
            # last bytes go out, so that even a Content-Length answer ends visibly short.
            raise _Cut("upstream_bad_response", "upstream sent bytes after the end of its answer")
        if not data:
            break
        await send({"type": "http.response.body", "body": data, "more_body": True})
        wait, stall = idle, "idle"
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _refuse(send: Send, failure: ProxyError, metrics: Metrics, request_id: str) -> str:
    """Answer a failure before our head as JSON; count it when it is upstream's."""
    error = failure.code or failure.error_type
    if isinstance(failure, UpstreamError):
        kind = "timeout" if failure.code == "upstream_timeout" else error
        metrics.upstream_errors.labels(kind).inc()
        if kind == "timeout":
            metrics.timeouts.labels("first_byte").inc()
    await asgi.send_error(send, failure, [(b"x-request-id", request_id.encode())])
    return error
