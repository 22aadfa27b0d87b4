"""A plain byte-relay proxy on the proxy's own stack (starlette + uvicorn on uvloop + httptools,
httpx or the proxy's lean upstream client): the floor for any Python proxy in front of
trtllm-serve. Benchmark 2 compares the proxy's added latency with it.

    .venv/bin/python bench/byte_relay.py --upstream http://127.0.0.1:8000 [--client lean]

`--client httpx` (default) is what the proxy's pass-through uses; `--client lean` relays through
`proxy.upstream_stream.StreamClient`, the client of the proxy's repaired completion streams.

Every request goes to the upstream as it came (method, path, query, headers but Host, body) and
the answer comes back chunk by chunk as httpx reads it, exactly like the proxy's pass-through,
without any parsing. `GET /health` answers locally.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from proxy.upstream_stream import StreamClient

_DROP = {b"host", b"content-length", b"transfer-encoding", b"connection"}


def create_relay(upstream: str) -> Starlette:
    client = httpx.AsyncClient(
        base_url=upstream,
        timeout=httpx.Timeout(connect=5.0, read=None, write=60.0, pool=None),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
    )

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
        request = client.build_request(scope["method"], target, headers=headers, content=body)
        response = await client.send(request, stream=True)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [
                        (k.encode("latin-1"), v.encode("latin-1"))
                        for k, v in response.headers.multi_items()
                        if k.encode() not in _DROP
                    ],
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()

    app = Starlette(lifespan=lifespan)
    app.mount("/", relay)
    return app


def create_lean_relay(upstream: str) -> Starlette:
    """The same relay through the lean client (body bytes, de-chunked, re-chunked by uvicorn)."""
    client = StreamClient(upstream, connect_timeout=5.0, keepalive_expiry=4.0)

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
        response = await client.send(scope["method"], target, headers, body)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status,
                    "headers": [
                        (k.encode("latin-1"), v.encode("latin-1"))
                        for k, v in response.head.headers
                        if k.encode() not in _DROP
                    ],
                }
            )
            while chunk := await response.read():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            response.close()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()

    app = Starlette(lifespan=lifespan)
    app.mount("/", relay)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--client", choices=("httpx", "lean"), default="httpx")
    args = parser.parse_args()
    create = create_lean_relay if args.client == "lean" else create_relay
    uvicorn.run(
        create(args.upstream),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        server_header=False,
    )


if __name__ == "__main__":
    main()
