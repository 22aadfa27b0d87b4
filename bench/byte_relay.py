"""A plain byte-relay proxy on the proxy's own stack (starlette + uvicorn on uvloop + httptools,
httpx or the proxy's lean upstream client): the floor for any Python proxy in front of
trtllm-serve. Benchmark 2 compares the proxy's added latency with it.

    .venv/bin/python bench/byte_relay.py --upstream http://127.0.0.1:8000 [--client lean]

`--client httpx` (default) is what the proxy's pass-through used before the lean client;
`--client lean` relays through `proxy.upstream.stream.StreamClient`, the client of the proxy's
repaired completion streams and of its pass-through.

Every request goes to the upstream as it came (method, path, query, headers but Host, body) and
the answer comes back chunk by chunk as the client reads it, like the proxy's pass-through,
without any parsing. `GET /health` answers locally.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from proxy.upstream.stream import Response, StreamClient

_DROP = {b"host", b"content-length", b"transfer-encoding", b"connection"}

Headers = list[tuple[bytes, bytes]]
#: One upstream exchange: (method, target, headers, body) → status, headers, body chunks.
Exchange = Callable[
    [str, str, Headers, bytes],
    contextlib.AbstractAsyncContextManager[tuple[int, Headers, AsyncIterator[bytes]]],
]


def httpx_exchange(upstream: str) -> tuple[Exchange, Callable[[], Awaitable[None]]]:
    client = httpx.AsyncClient(
        base_url=upstream,
        timeout=httpx.Timeout(connect=5.0, read=None, write=60.0, pool=None),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
    )

    @contextlib.asynccontextmanager
    async def exchange(
        method: str, target: str, headers: Headers, body: bytes
    ) -> AsyncIterator[tuple[int, Headers, AsyncIterator[bytes]]]:
        request = client.build_request(method, target, headers=headers, content=body)
        response = await client.send(request, stream=True)
        try:
            head = [
                (k.encode("latin-1"), v.encode("latin-1"))
                for k, v in response.headers.multi_items()
            ]
            yield response.status_code, head, response.aiter_raw()
        finally:
            await response.aclose()

    return exchange, client.aclose


def lean_exchange(upstream: str) -> tuple[Exchange, Callable[[], Awaitable[None]]]:
    client = StreamClient(upstream, connect_timeout=5.0, keepalive_expiry=4.0)

    async def chunks(response: Response) -> AsyncIterator[bytes]:
        while chunk := await response.read():
            yield chunk

    @contextlib.asynccontextmanager
    async def exchange(
        method: str, target: str, headers: Headers, body: bytes
    ) -> AsyncIterator[tuple[int, Headers, AsyncIterator[bytes]]]:
        response = await client.send(method, target, headers, body)
        try:
            head = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.head.headers]
            yield response.status, head, chunks(response)
        finally:
            response.close()

    return exchange, client.aclose


def create_relay(upstream: str, client: str = "httpx") -> Starlette:
    exchange, close = (lean_exchange if client == "lean" else httpx_exchange)(upstream)

    async def relay(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k, v) for k, v in scope["headers"] if k not in _DROP]
        target = scope["raw_path"].decode("latin-1")
        if scope["query_string"]:
            target += "?" + scope["query_string"].decode("latin-1")
        async with exchange(scope["method"], target, headers, body) as (status, head, chunks):
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [(k, v) for k, v in head if k.lower() not in _DROP],
                }
            )
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await close()

    app = Starlette(lifespan=lifespan)
    app.mount("/", relay)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--client", choices=("httpx", "lean"), default="httpx")
    args = parser.parse_args()
    uvicorn.run(
        create_relay(args.upstream, args.client),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        server_header=False,
    )


if __name__ == "__main__":
    main()
