"""The proxy's side of trtllm-serve: token-id completion streams, the capability probe, `/health`,
and requests passed through untouched — all on one client, the lean HTTP/1.1 client of
`proxy.upstream.stream` (less CPU per frame and memory per open stream than httpx, and an llhttp
parser and pool that never let a malformed answer's stray bytes reach the next request): one
pool, one TLS set-up, one set of timeouts.

Errors before the first byte become `UpstreamError`/`ClientError` (an HTTP error for our client);
errors once frames flow become `FrameError` (the shell turns them into `response.failed`).
Every upstream response is closed by its owner's `async with`, also when our client goes away,
so trtllm-serve stops generating (it aborts a request whose connection closed).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import orjson

from proxy.errors import ClientError, UpstreamError
from proxy.upstream.completions import describe_error_body, error_message
from proxy.upstream.frames import Frames
from proxy.upstream.probe import Capability, Decode, probe
from proxy.upstream.stream import (
    ConnectTimeout,
    MalformedResponseError,
    Response,
    StreamClient,
    StreamError,
)
from proxy.upstream.transport import Transport

#: Hop-by-hop headers (RFC 9110 §7.6.1) and `host`, which the client writes itself: never
#: forwarded.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
#: Headers of the client's request that do not describe the body we send upstream.
_REPLACED = ("content-type", "content-length", "content-encoding", "accept", "accept-encoding")
#: Error bodies (a 4xx/5xx answer to /v1/completions) are read for at most this long after
#: their head, and never past the request's own first-token deadline: a 503 whose body never
#: ends is answered in this time, not when the timeouts of a stream run out.
ERROR_BODY_SECONDS = 2.0
#: ... and up to this size: a message is short; more is not an error object we can quote.
ERROR_BODY_LIMIT = 64 * 1024
#: Seconds an idle upstream connection is kept for reuse. Below the 5 s after which uvicorn
#: (trtllm-serve's server) closes idle connections: kept as long, a request could be written
#: into a connection the server was closing, and failed with a ReadError (502) under load
#: (tests/test_reliability_load.py).
KEEPALIVE_EXPIRY = 2.0
#: Seconds `GET /health` may take (readiness probes run every few seconds).
HEALTH_SECONDS = 2.0


def end_to_end(
    headers: Iterable[tuple[str, str]], *, drop: Iterable[str] = ()
) -> list[tuple[str, str]]:
    """The headers a proxy may forward: hop-by-hop ones and those named in `Connection` removed."""
    pairs = list(headers)
    named = {
        token.strip().lower()
        for name, value in pairs
        if name.lower() == "connection"
        for token in value.split(",")
    }
    excluded = HOP_BY_HOP | named | {name.lower() for name in drop}
    return [(name, value) for name, value in pairs if name.lower() not in excluded]


class Upstream:
    """trtllm-serve at `base_url`, reached through one `StreamClient` whose connections come
    from `transport` (default: TCP, TLS for https; tests inject their own)."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float,
        transport: Transport | None = None,
        error_body_seconds: float = ERROR_BODY_SECONDS,
    ) -> None:
        self.base_url = base_url
        self._error_body_seconds = error_body_seconds
        self._streams = StreamClient(
            base_url,
            connect_timeout=connect_timeout,
            keepalive_expiry=KEEPALIVE_EXPIRY,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._streams.aclose()

    @asynccontextmanager
    async def completion_stream(
        self, body: Mapping[str, Any], headers: Iterable[tuple[str, str]], *, timeout: float
    ) -> AsyncIterator[Frames]:
        """POST /v1/completions (streaming) and yield its frames.

        Raises `ClientError` (upstream's 4xx, passed on), `UpstreamError` (unreachable: 502,
        no answer within `timeout`: 504, 5xx or not an event stream: 502) before the first frame.
        The frames raise `FrameError` when the connection breaks or a frame is oversize.
        """
        deadline = asyncio.get_running_loop().time() + timeout
        logprobs = bool(body.get("logprobs"))
        response = await self._open(body, headers, timeout)
        # Sent: not kept while the stream is open (the body's prompt ids: ~40 bytes each).
        del headers, body
        try:
            left = deadline - asyncio.get_running_loop().time()
            await _check_status(response, max(0.0, min(self._error_body_seconds, left)))
            content_type = response.head.get("content-type")
            if not content_type.startswith("text/event-stream"):
                raise UpstreamError(
                    f"upstream answered /v1/completions with {content_type or 'no content type'}, "
                    "not an event stream",
                    code="upstream_bad_response",
                )
            coding = response.head.get("content-encoding", "identity")
            if coding.lower() != "identity":
                raise UpstreamError(
                    f"upstream answered /v1/completions with content-encoding {coding}",
                    code="upstream_bad_response",
                )
            yield Frames(response, logprobs=logprobs)
        finally:
            response.close()

    async def _open(
        self, body: Mapping[str, Any], headers: Iterable[tuple[str, str]], timeout: float
    ) -> Response:
        """Send the completion request and wait for upstream's head (a separate frame: nothing
        of the request is kept while the stream is open)."""
        wire = _wire(
            [
                *end_to_end(headers, drop=_REPLACED),
                ("content-type", "application/json"),
                ("accept", "text/event-stream"),
                # No coding we would have to undo (without the header any coding is acceptable).
                ("accept-encoding", "identity"),
            ]
        )
        return await self._send("POST", "/v1/completions", wire, orjson.dumps(body), None, timeout)

    async def _send(
        self,
        method: str,
        target: str,
        wire: list[tuple[bytes, bytes]],
        body: bytes | AsyncIterable[bytes],
        length: int | None,
        timeout: float,
    ) -> Response:
        """One request on the lean client, its failures before the head as `UpstreamError`s.
        Errors of a streamed body's source (our client's 413, its disconnect) pass as they are."""
        try:
            async with asyncio.timeout(timeout):
                return await self._streams.send(method, target, wire, body, length=length)
        except TimeoutError:
            raise UpstreamError(
                f"upstream did not answer within {timeout:g} s",
                status=504,
                code="upstream_timeout",
            ) from None
        except ConnectTimeout as exc:
            raise UpstreamError(
                f"could not connect to upstream {self.base_url} in time ({type(exc).__name__})",
                status=504,
                code="upstream_timeout",
            ) from exc
        except MalformedResponseError as exc:
            raise UpstreamError(
                f"upstream sent an invalid HTTP response: {exc}", code="upstream_bad_response"
            ) from exc
        except StreamError as exc:
            raise UpstreamError(
                f"cannot reach upstream {self.base_url}: {type(exc).__name__}",
                code="upstream_unreachable",
            ) from exc

    async def get_health(self) -> int:
        """Upstream's `GET /health` status (200 while its engine is up); `UpstreamError`, its
        message saying why, when upstream cannot be asked."""
        response = await self._send("GET", "/health", [], b"", None, HEALTH_SECONDS)
        response.close()  # its body, if any, says nothing more
        return response.status

    async def probe(self, model: str | None = None, *, decode: Decode | None = None) -> Capability:
        """What upstream's /v1/completions can do for us (probe.py): token ids, token logprobs,
        and — given `decode` to read the ids — whether it enforces `response_format`."""
        return await probe(self._streams, model, decode)

    @asynccontextmanager
    async def forward(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes | AsyncIterable[bytes],
        *,
        length: int | None = None,
        timeout: float,
    ) -> AsyncIterator[Response]:
        """Send a request through unchanged (pass-through) and yield upstream's answer, whose
        body is read as it arrives (`Response.read`). A streamed `body` goes up with `length`
        as its Content-Length, or chunked.

        Raises `UpstreamError` before the answer's head is ours: unreachable (502), no head
        within `timeout` (504), an invalid head or a bodyless answer followed by bytes — a 204
        "with a body" (502, `upstream_bad_response`)."""
        # The client's Content-Length describes the body as it comes; ours is written anew.
        wire = _wire(end_to_end(headers, drop=("content-length",)))
        response = await self._send(method, target, wire, body, length, timeout)
        try:
            if response.done and response.trailing:
                raise UpstreamError(
                    f"upstream sent bytes after the end of its HTTP {response.status} answer",
                    code="upstream_bad_response",
                )
            yield response
        finally:
            response.close()


def _wire(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """Header values as the bytes the client sent. They reach us decoded as Latin-1 (HTTP allows
    any octet above 0x7F in a value); encoded as ASCII instead, a client's `X-Custom: café`
    raised UnicodeEncodeError: a 500 (tests/test_reliability_input.py)."""
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]


async def _check_status(response: Response, seconds: float) -> None:
    if response.status == 200:
        return
    raw, cut = await _error_body(response, seconds)
    message = None if cut is not None else error_message(raw)
    status = response.status
    rejected = 400 <= status < 500
    if message is not None:
        said = f": {message}"
    else:
        what = describe_error_body(raw, response.head.get("content-type"), cut)
        said = f" with HTTP {status} and {what}" if rejected else f" and {what}"
    if rejected:
        # Upstream judged the request: pass its status and words on.
        raise ClientError(
            f"upstream rejected the request{said}", status=status, code="upstream_rejected"
        )
    raise UpstreamError(f"upstream failed with HTTP {status}{said}", code="upstream_error")


async def _error_body(response: Response, seconds: float) -> tuple[bytes, str | None]:
    """Upstream's error body, read for at most `seconds` and `ERROR_BODY_LIMIT` bytes, and why
    it is incomplete (None: it is whole)."""
    raw = b""
    try:
        async with asyncio.timeout(seconds):
            while chunk := await response.read():
                raw += chunk
                if len(raw) > ERROR_BODY_LIMIT:
                    return raw[:ERROR_BODY_LIMIT], f"longer than {ERROR_BODY_LIMIT // 1024} KiB"
    except TimeoutError:
        return raw, f"not complete within {seconds:g} s"
    except StreamError:
        return raw, "cut off by the connection"
    return raw, None
