"""The lean upstream client (proxy/upstream/stream.py) and `Upstream.completion_stream` on it,
against scripted servers on real loopback sockets."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import trustme

from proxy.errors import ClientError, UpstreamError
from proxy.upstream.client import Upstream
from proxy.upstream.completions import FrameError
from proxy.upstream.frames import MAX_FRAME_BYTES
from proxy.upstream.stream import (
    HIGH_WATER,
    ConnectError,
    ConnectTimeout,
    LocalProtocolError,
    ReadError,
    RemoteProtocolError,
    StreamClient,
)
from proxy.upstream.transport import tls_context

FRAME = b'data: {"choices":[{"index":0,"token_ids":[1,2],"finish_reason":null}]}\n\n'
LAST = b'data: {"choices":[{"index":0,"token_ids":[3],"finish_reason":"stop"}]}\n\n'
SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"


def chunked(*pieces: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)
    return SSE_HEAD + b"transfer-encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"


def sized(body: bytes, head: bytes = SSE_HEAD) -> bytes:
    return head + b"content-length: %d\r\n\r\n" % len(body) + body


@dataclass
class Request:
    head: bytes
    body: bytes
    connection: int
    reader: asyncio.StreamReader

    async def until_closed(self, limit: float = 10.0) -> bool:
        """Wait (as a generating upstream would) until the client closes; False: never."""
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(limit):
                while await self.reader.read(65536):
                    pass
        return False

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        lines = self.head.removesuffix(b"\r\n\r\n").split(b"\r\n")[1:]
        return [(n.strip().lower(), v.strip()) for n, _, v in (x.partition(b":") for x in lines)]


Handler = Callable[[Request, asyncio.StreamWriter], Awaitable[bool]]


@dataclass
class Server:
    """A raw HTTP/1.1 server: each request is answered by `handler` (return False to close)."""

    handler: Handler
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    closed_at: list[float] = field(default_factory=list)  # when a client connection went away
    server: asyncio.Server | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                request = Request(head, await reader.readexactly(length), number, reader)
                self.requests.append(request)
                if not await self.handler(request, writer):
                    if reader.at_eof():
                        self.closed_at.append(time.monotonic())
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_at.append(time.monotonic())
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[Server]:
    server = Server(handler)
    server.server = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    try:
        yield server
    finally:
        server.server.close()
        for task in server.tasks:
            task.cancel()
        await asyncio.gather(*server.tasks, return_exceptions=True)


def answer(raw: bytes, *, keep: bool = True) -> Handler:
    async def handle(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(raw)
        await writer.drain()
        return keep

    return handle


async def get(client: StreamClient, path: str = "/v1/completions") -> tuple[int, bytes]:
    response = await client.send("POST", path, [(b"x-a", b"1")], b"{}")
    try:
        body = b""
        while chunk := await response.read():
            body += chunk
        return response.status, body
    finally:
        response.close()


def client_for(server: Server, **options: float) -> StreamClient:
    settings = {"connect_timeout": 2.0, "keepalive_expiry": 2.0, **options}
    return StreamClient(server.url, **settings)  # type: ignore[arg-type]


# -- bodies and the pool --------------------------------------------------------------------------


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_bodies_are_read_and_the_connection_reused(framing: str) -> None:
    raw = chunked(FRAME, LAST) if framing == "chunked" else sized(FRAME + LAST)

    async def run() -> None:
        async with serving(answer(raw)) as server:
            client = client_for(server)
            for _ in range(3):
                assert await get(client) == (200, FRAME + LAST)
            assert server.connections == 1
            assert [r.connection for r in server.requests] == [1, 1, 1]
            assert client.idle_connections == 1
            await client.aclose()

    asyncio.run(run())


def test_request_head_and_body_on_the_wire() -> None:
    async def run() -> None:
        async with serving(answer(sized(b""))) as server:
            base = server.url + "/prefix/"
            client = StreamClient(base, connect_timeout=2.0, keepalive_expiry=2.0)
            response = await client.send(
                "POST", "/v1/completions", [(b"x-cafe", b"caf\xe9"), (b"Host", b"evil")], b"{}"
            )
            response.close()
            (request,) = server.requests
            assert request.head.startswith(b"POST /prefix/v1/completions HTTP/1.1\r\n")
            port = server.url.rsplit(":", 1)[1].encode()
            assert request.headers == [
                (b"host", b"127.0.0.1:" + port),  # the configured upstream, never the client's
                (b"x-cafe", b"caf\xe9"),  # the bytes the client sent
                (b"content-length", b"2"),
            ]
            assert request.body == b"{}"
            await client.aclose()

    asyncio.run(run())


@pytest.mark.parametrize(
    "raw",
    [
        SSE_HEAD + b"\r\n" + FRAME,  # read until close
        SSE_HEAD + b"connection: close\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n",
    ],
    ids=["until_close", "connection_close", "http10"],
)
def test_connections_that_cannot_be_reused_are_closed(raw: bytes) -> None:
    async def run() -> None:
        async with serving(answer(raw, keep=False)) as server:
            client = client_for(server)
            for _ in range(2):
                assert (await get(client))[0] == 200
            assert server.connections == 2
            assert client.idle_connections == 0
            await client.aclose()

    asyncio.run(run())


def test_a_response_not_read_to_its_end_is_never_reused() -> None:
    async def handle(request: Request, writer: asyncio.StreamWriter) -> bool:
        if request.connection == 1:
            writer.write(SSE_HEAD + b"transfer-encoding: chunked\r\n\r\n")
            writer.write(b"%x\r\n%s\r\n" % (len(FRAME), FRAME))  # and never the end
        else:
            writer.write(chunked(FRAME))
        await writer.drain()
        return True

    async def run() -> None:
        async with serving(handle) as server:
            client = client_for(server)
            response = await client.send("POST", "/v1/completions", [], b"{}")
            assert await response.read() == FRAME
            response.close()
            assert client.idle_connections == 0
            assert await get(client) == (200, FRAME)
            assert server.connections == 2
            await asyncio.sleep(0.05)
            assert len(server.closed_at) == 1  # the first connection went away at once
            await client.aclose()

    asyncio.run(run())


def test_unread_bytes_of_a_whole_response_never_reach_the_next_one() -> None:
    # Upstream sent everything, the owner stopped after the first frame (say it was bad): the
    # connection may carry the next request, but the rest of the first body must not.
    async def run() -> None:
        async with serving(answer(chunked(FRAME, LAST))) as server:
            client = client_for(server)
            response = await client.send("POST", "/", [], b"")
            while client.idle_connections == 0:
                connection = response._connection
                assert connection is not None
                if connection._reader.done:
                    response.close()  # nothing read
                    break
                await asyncio.sleep(0.01)
            assert client.idle_connections == 1
            assert await get(client) == (200, FRAME + LAST)
            assert server.connections == 1
            await client.aclose()

    asyncio.run(run())


def test_idle_connections_expire() -> None:
    now = [100.0]

    async def run() -> None:
        async with serving(answer(sized(b"ok"))) as server:
            client = StreamClient(
                server.url, connect_timeout=2.0, keepalive_expiry=2.0, clock=lambda: now[0]
            )
            await get(client)
            now[0] += 1.9
            await get(client)
            assert server.connections == 1
            now[0] += 2.1
            await get(client)
            assert server.connections == 2
            await asyncio.sleep(0.05)
            assert len(server.closed_at) == 1  # the expired one was closed, not leaked
            await client.aclose()

    asyncio.run(run())


def test_a_connection_upstream_closed_while_idle_is_not_reused() -> None:
    async def run() -> None:
        async with serving(answer(sized(b"ok"), keep=False)) as server:  # closes after answering
            client = client_for(server)
            await get(client)
            await asyncio.sleep(0.05)  # its FIN arrives
            assert await get(client) == (200, b"ok")
            assert server.connections == 2
            await client.aclose()

    asyncio.run(run())


def second_request_on_the_first_connection(reply: bytes) -> Handler:
    """Answers `ok`, except the second request: `reply` (maybe nothing), then the connection
    closes — upstream closing an idle keep-alive connection just as it is reused."""
    count = 0

    async def handle(request: Request, writer: asyncio.StreamWriter) -> bool:
        nonlocal count
        count += 1
        if count == 2:
            writer.write(reply)
            await writer.drain()
            return False
        writer.write(sized(b"ok"))
        await writer.drain()
        return True

    return handle


def test_a_request_on_a_connection_upstream_drops_unanswered_is_sent_again() -> None:
    # Nothing of an answer came back: upstream never read it, so it goes out once more.
    async def run() -> None:
        async with serving(second_request_on_the_first_connection(b"")) as server:
            client = client_for(server)
            assert await get(client) == (200, b"ok")
            assert await get(client) == (200, b"ok")
            assert [r.connection for r in server.requests] == [1, 1, 2]
            await client.aclose()

    asyncio.run(run())


def test_a_reused_connection_that_breaks_mid_answer_is_not_retried() -> None:
    begun = b"HTTP/1.1 200 OK\r\ncontent-le"  # upstream read the request and began

    async def run() -> None:
        async with serving(second_request_on_the_first_connection(begun)) as server:
            client = client_for(server)
            await get(client)
            with pytest.raises(RemoteProtocolError):
                await get(client)
            assert len(server.requests) == 2
            await client.aclose()

    asyncio.run(run())


def test_a_new_connection_that_drops_the_request_is_not_retried() -> None:
    async def run() -> None:
        async with serving(answer(b"", keep=False)) as server:
            client = client_for(server)
            with pytest.raises(RemoteProtocolError):
                await get(client)
            assert len(server.requests) == 1
            await client.aclose()

    asyncio.run(run())


def test_idle_connections_are_capped() -> None:
    async def run() -> None:
        async with serving(answer(sized(b"ok"))) as server:
            client = StreamClient(server.url, connect_timeout=2, keepalive_expiry=2, max_idle=2)
            responses = [await client.send("POST", "/", [], b"") for _ in range(4)]
            for response in responses:
                assert await response.read() == b"ok"
                response.close()
            assert client.idle_connections == 2
            await client.aclose()
            assert client.idle_connections == 0

    asyncio.run(run())


def test_tcp_nodelay() -> None:
    async def run() -> None:
        async with serving(answer(sized(b"ok"))) as server:
            client = client_for(server)
            await get(client)
            connection = client._idle[0]
            transport = connection._transport
            assert transport is not None
            sock = transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            await client.aclose()

    asyncio.run(run())


def test_backpressure_stops_reading_the_socket() -> None:
    piece = b"x" * 65536
    count = 64  # 4 MiB, far more than the kernel buffers on loopback

    async def handle(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(SSE_HEAD + b"content-length: %d\r\n\r\n" % (len(piece) * count))
        for _ in range(count):
            writer.write(piece)
            await writer.drain()
        return True

    async def run() -> None:
        async with serving(handle) as server:
            client = client_for(server)
            response = await client.send("POST", "/", [], b"")
            await asyncio.sleep(0.3)  # nobody reads
            connection = response._connection
            assert connection is not None
            assert connection._paused
            assert connection._buffered < HIGH_WATER + 300_000
            total = 0
            while chunk := await response.read():
                total += len(chunk)
            assert total == len(piece) * count
            response.close()
            assert client.idle_connections == 1
            await client.aclose()

    asyncio.run(run())


# -- errors ---------------------------------------------------------------------------------------


def test_connection_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused

    async def run() -> None:
        client = StreamClient(f"http://127.0.0.1:{port}", connect_timeout=2, keepalive_expiry=2)
        with pytest.raises(ConnectError, match="ConnectionRefusedError"):
            await client.send("POST", "/", [], b"")

    asyncio.run(run())


def test_connect_timeout() -> None:
    # A listener whose backlog is full: the kernel drops further SYNs, so connecting hangs.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        time.sleep(0.1)

        async def run() -> None:
            client = StreamClient(
                f"http://127.0.0.1:{port}", connect_timeout=0.3, keepalive_expiry=2
            )
            started = time.monotonic()
            with pytest.raises(ConnectTimeout):
                await client.send("POST", "/", [], b"")
            assert time.monotonic() - started < 1.5

        try:
            asyncio.run(run())
        finally:
            for filler in fillers:
                filler.close()


def test_a_header_that_would_split_the_request_is_not_sent() -> None:
    async def run() -> None:
        async with serving(answer(sized(b""))) as server:
            client = client_for(server)
            with pytest.raises(LocalProtocolError):
                await client.send("POST", "/", [(b"x-a", b"1\r\nx-b: 2")], b"")
            assert server.connections == 0

    asyncio.run(run())


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"", RemoteProtocolError),  # closed before the status line
        (b"HTTP/1.1 200 OK\r\nx-evil:\x00\r\n\r\n", RemoteProtocolError),
        (b"garbage\r\n\r\n", RemoteProtocolError),
    ],
    ids=["closed", "nul", "garbage"],
)
def test_bad_heads(raw: bytes, error: type[Exception]) -> None:
    async def run() -> None:
        async with serving(answer(raw, keep=False)) as server:
            client = client_for(server)
            with pytest.raises(error):
                await client.send("POST", "/", [], b"")
            assert client.idle_connections == 0

    asyncio.run(run())


@pytest.mark.parametrize("how", ["eof", "reset"])
def test_connection_broken_mid_body(how: str) -> None:
    async def handle(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(SSE_HEAD + b"transfer-encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(FRAME), FRAME))
        await writer.drain()
        await asyncio.sleep(0.05)
        if how == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
            writer.transport.abort()
        return False

    async def run() -> None:
        async with serving(handle) as server:
            client = client_for(server)
            response = await client.send("POST", "/", [], b"")
            assert await response.read() == FRAME
            expected = ReadError if how == "reset" else RemoteProtocolError
            with pytest.raises(expected):
                await response.read()
            response.close()
            assert client.idle_connections == 0

    asyncio.run(run())


# -- Upstream.completion_stream on the lean client -----------------------------------------------


async def frames_of(upstream: Upstream, timeout: float = 5.0) -> list[tuple[int, ...]]:
    async with upstream.completion_stream({"prompt": [1]}, [], timeout=timeout) as frames:
        return [frame.token_ids async for frame in frames]


class _Body(dict[str, Any]):
    """A body that can be watched for going away (a dict takes no weak reference)."""


def test_completion_stream_keeps_nothing_of_the_body_while_it_is_open() -> None:
    """The prompt's ids go with the send: the body does not stay with the open stream (memory
    per open stream, bench/stream_memory.py)."""

    async def run() -> None:
        async with serving(answer(chunked(FRAME, LAST, b"data: [DONE]\n\n"))) as server:
            upstream = Upstream(server.url, connect_timeout=2)
            body = _Body(prompt=[1])
            gone = weakref.ref(body)
            opened = upstream.completion_stream(body, [], timeout=5)
            del body
            async with opened as frames:
                assert gone() is None
                got = [f.token_ids async for f in frames]
            assert got == [(1, 2), (3,), ()]
            (request,) = server.requests
            assert orjson.loads(request.body) == {"prompt": [1]}
            await upstream.aclose()

    asyncio.run(run())


def test_the_client_connects_directly_whatever_proxy_the_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A forward proxy that refuses everything: a client that used it would fail. Upstream is the
    # server next to the proxy; neither /health nor the streams go through a forward proxy.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, refused)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)

    async def handle(request: Request, writer: asyncio.StreamWriter) -> bool:
        if request.head.startswith(b"GET /health"):
            writer.write(sized(b"", head=b"HTTP/1.1 200 OK\r\n"))
        else:
            writer.write(chunked(FRAME, LAST, b"data: [DONE]\n\n"))
        await writer.drain()
        return True

    async def run() -> None:
        async with serving(handle) as server:
            upstream = Upstream(server.url, connect_timeout=2)
            assert await upstream.get_health() == 200
            assert await frames_of(upstream) == [(1, 2), (3,), ()]
            await upstream.aclose()

    asyncio.run(run())


def test_an_https_upstream_is_verified_against_the_configured_ca(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A private CA, as operators use for in-cluster TLS, named by SSL_CERT_FILE.
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))

    async def handle(request: Request, writer: asyncio.StreamWriter) -> bool:
        if request.head.startswith(b"GET /health"):
            writer.write(sized(b"", head=b"HTTP/1.1 200 OK\r\n"))
        else:
            writer.write(chunked(FRAME, LAST))
        await writer.drain()
        return True

    async def run() -> None:
        server = Server(handle)
        server.server = await asyncio.start_server(server.serve, "127.0.0.1", 0, ssl=server_context)
        url = f"https://localhost:{server.server.sockets[0].getsockname()[1]}"
        try:
            monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
            upstream = Upstream(url, connect_timeout=2)
            assert await upstream.get_health() == 200
            assert await frames_of(upstream) == [(1, 2), (3,)]
            await upstream.aclose()
            monkeypatch.delenv("SSL_CERT_FILE")  # certifi's bundle: this CA is unknown
            upstream = Upstream(url, connect_timeout=2)
            with pytest.raises(UpstreamError) as caught:
                await frames_of(upstream)
            assert caught.value.code == "upstream_unreachable"
            await upstream.aclose()
        finally:
            server.server.close()
            for task in server.tasks:
                task.cancel()
            await asyncio.gather(*server.tasks, return_exceptions=True)

    asyncio.run(run())


def test_tls_trust_is_the_named_ca_else_certifis_bundle(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    named = tls_context({"SSL_CERT_FILE": str(ca_file)}).get_ca_certs()
    assert len(named) == 1
    assert "trustme" in str(named[0]["subject"])
    bundle = tls_context({}).get_ca_certs()
    assert len(bundle) > 50  # certifi's bundle, whatever the system holds
    assert "trustme" not in str(bundle)
    directory = tls_context({"SSL_CERT_DIR": str(tmp_path)})
    assert directory.verify_mode == ssl.CERT_REQUIRED
    assert directory.check_hostname


def test_completion_stream_frames_and_headers() -> None:
    async def run() -> None:
        async with serving(answer(chunked(FRAME, LAST, b"data: [DONE]\n\n"))) as server:
            upstream = Upstream(server.url, connect_timeout=2)
            headers = [
                ("authorization", "Bearer sk"),
                ("connection", "x-hop"),
                ("x-hop", "1"),
                ("content-length", "999"),
                ("x-latin", "café"),
            ]
            async with upstream.completion_stream({"prompt": [1]}, headers, timeout=5) as frames:
                got = [(f.token_ids, f.done) async for f in frames]
            assert got == [((1, 2), False), ((3,), False), ((), True)]
            (request,) = server.requests
            sent = dict(request.headers)
            assert sent[b"authorization"] == b"Bearer sk"
            assert sent[b"x-latin"] == "café".encode("latin-1")
            assert b"x-hop" not in sent
            assert b"connection" not in sent
            assert sent[b"content-length"] == b"%d" % len(request.body)
            assert sent[b"accept"] == b"text/event-stream"
            assert sent[b"accept-encoding"] == b"identity"
            assert orjson.loads(request.body) == {"prompt": [1]}
            await upstream.aclose()

    asyncio.run(run())


@pytest.mark.parametrize(
    ("raw", "kind", "status", "code", "message"),
    [
        (
            sized(b'{"object":"error","message":"bad prompt"}', b"HTTP/1.1 400 Bad\r\n"),
            ClientError,
            400,
            "upstream_rejected",
            "upstream rejected the request: bad prompt",
        ),
        (
            sized(b'{"error":{"message":"slow down"}}', b"HTTP/1.1 429 Busy\r\n"),
            ClientError,
            429,
            "upstream_rejected",
            "slow down",
        ),
        (
            sized(b"oops", b"HTTP/1.1 503 Unavailable\r\n"),
            UpstreamError,
            502,
            "upstream_error",
            "upstream failed with HTTP 503 and an error body that is not JSON (4 bytes of no "
            "content type; not quoted)",
        ),
        (
            sized(b"{}", b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"),
            UpstreamError,
            502,
            "upstream_bad_response",
            "not an event stream",
        ),
        (
            sized(b"", SSE_HEAD + b"content-encoding: gzip\r\n"),
            UpstreamError,
            502,
            "upstream_bad_response",
            "content-encoding gzip",
        ),
        (
            b"HTTP/1.1 200 OK\r\nbad\r\n\r\n",
            UpstreamError,
            502,
            "upstream_bad_response",
            "upstream sent an invalid HTTP response: Invalid header token",
        ),
        (b"", UpstreamError, 502, "upstream_unreachable", "RemoteProtocolError"),
    ],
    ids=["400", "429", "503", "json", "gzip", "bad_head", "no_answer"],
)
def test_errors_before_the_first_frame(
    raw: bytes, kind: type[Exception], status: int, code: str, message: str
) -> None:
    async def run() -> None:
        async with serving(answer(raw, keep=False)) as server:
            upstream = Upstream(server.url, connect_timeout=2)
            with pytest.raises(kind) as caught:
                await frames_of(upstream)
            error = caught.value
            assert isinstance(error, ClientError | UpstreamError)
            assert (error.status, error.code) == (status, code)
            assert message in error.message
            await upstream.aclose()

    asyncio.run(run())


def test_unreachable_and_timeouts() -> None:
    async def stall(request: Request, writer: asyncio.StreamWriter) -> bool:
        return await request.until_closed(5)

    async def run() -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        upstream = Upstream(url, connect_timeout=2)
        with pytest.raises(UpstreamError) as caught:
            await frames_of(upstream)
        assert (caught.value.status, caught.value.code) == (502, "upstream_unreachable")
        assert caught.value.message == f"cannot reach upstream {url}: ConnectError"
        async with serving(stall) as server:
            upstream = Upstream(server.url, connect_timeout=2)
            started = time.monotonic()
            with pytest.raises(UpstreamError) as caught:
                await frames_of(upstream, timeout=0.3)
            assert (caught.value.status, caught.value.code) == (504, "upstream_timeout")
            assert caught.value.message == "upstream did not answer within 0.3 s"
            assert time.monotonic() - started < 1.0
            await upstream.aclose()

    asyncio.run(run())


def test_errors_once_frames_flow() -> None:
    async def cut(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(SSE_HEAD + b"transfer-encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(FRAME), FRAME))
        await writer.drain()
        return False

    async def oversize(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(SSE_HEAD + b"\r\ndata: ")
        blob = b"1" * 65536
        for _ in range(MAX_FRAME_BYTES // len(blob) + 2):
            writer.write(blob)
            await writer.drain()
        return False

    async def run() -> None:
        async with serving(cut) as server:
            upstream = Upstream(server.url, connect_timeout=2)
            with pytest.raises(FrameError) as caught:
                await frames_of(upstream)
            assert caught.value.code == "upstream_disconnected"
            assert "RemoteProtocolError" in caught.value.message
        async with serving(oversize) as server:
            upstream = Upstream(server.url, connect_timeout=2)
            with pytest.raises(FrameError) as caught:
                await frames_of(upstream)
            assert caught.value.code == "malformed_frame"

    asyncio.run(run())


def test_cancelling_the_exchange_closes_the_connection_at_once() -> None:
    async def slow(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(SSE_HEAD + b"transfer-encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(FRAME), FRAME))
        await writer.drain()
        return await request.until_closed()  # generating

    async def run() -> None:
        async with serving(slow) as server:
            upstream = Upstream(server.url, connect_timeout=2)
            first = asyncio.Event()

            async def exchange() -> None:
                async with upstream.completion_stream({}, [], timeout=5) as frames:
                    async for _ in frames:
                        first.set()

            task = asyncio.create_task(exchange())
            await first.wait()
            cancelled = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(100):
                if server.closed_at:
                    break
                await asyncio.sleep(0.01)
            assert server.closed_at, "upstream never saw the connection close"
            assert server.closed_at[0] - cancelled < 0.5
            assert upstream._streams.idle_connections == 0
            await upstream.aclose()

    asyncio.run(run())


def test_cancelling_while_waiting_for_the_head_closes_the_connection() -> None:
    async def silent(request: Request, writer: asyncio.StreamWriter) -> bool:
        return await request.until_closed()

    async def run() -> None:
        async with serving(silent) as server:
            upstream = Upstream(server.url, connect_timeout=2)
            task = asyncio.create_task(frames_of(upstream))
            while not server.requests:
                await asyncio.sleep(0.01)
            cancelled = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(100):
                if server.closed_at:
                    break
                await asyncio.sleep(0.01)
            assert server.closed_at
            assert server.closed_at[0] - cancelled < 0.5
            await upstream.aclose()

    asyncio.run(run())
